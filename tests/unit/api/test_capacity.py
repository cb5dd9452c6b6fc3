"""GET server_status (app/api/capacity.py) over fake trainers, samplers and replica counts: each base model's
trainers and samplers with their configured shape, readiness, replicas and work in flight."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from app.api.backends import ReplicaCounts
from app.api.capacity import server_status
from app.config import ServerConfig
from app.training_data.validation import ModelLimits


class _Calls:
    def __init__(self, ready: dict[str, bool], busy: dict[str, int]) -> None:
        self._ready, self._busy = ready, busy

    async def ready(self) -> dict[str, bool]:
        return self._ready

    def in_flight(self) -> dict[str, int]:
        return self._busy


class _Replicas(ReplicaCounts):
    def __init__(self, counts: dict[tuple[str, str], dict[str, int]]) -> None:
        self._counts = counts

    async def replicas(self) -> dict[tuple[str, str], dict[str, int]]:
        return self._counts


def status(replicas: ReplicaCounts | None) -> dict:
    config = ServerConfig(
        base_models=[
            {
                "name": "m",
                "path": "models/m",
                "critic_trainer": {"num_workers": 1},
                "sampler": {"min_replicas": 1, "max_replicas": 3},
            }
        ],
        quotas={"max_pending_samples": 16},
        auth={"mode": "any_tml_key_on_loopback"},
    )
    services = SimpleNamespace(
        config=config,
        trainers=_Calls({"m": True, "m:critic": False}, {"m": 3}),
        samplers=_Calls({"m": True}, {"m": 2}),
        replicas=replicas,
        model_limits={"m": ModelLimits(vocab_size=100, max_context_length=40960)},  # as the builder read the model
    )
    return asyncio.run(server_status(services))  # type: ignore[arg-type]


def test_server_status_reports_shape_replicas_and_queues() -> None:
    counts = {("trainer", "m"): {"RUNNING": 1}, ("sampler", "m"): {"RUNNING": 2, "STARTING": 1}}
    (model,) = status(_Replicas(counts))["base_models"]
    assert model["max_context_length"] == 40960
    policy, critic = model["trainers"]
    assert (policy["name"], policy["num_workers"], policy["ready"], policy["in_flight"]) == ("m", 2, True, 3)
    assert policy["replicas"] == {"RUNNING": 1}
    assert (critic["name"], critic["num_workers"], critic["ready"], critic["in_flight"]) == ("m:critic", 1, False, 0)
    assert critic["replicas"] == {}  # Serve knows of none
    sampler = model["sampler"]
    assert sampler["replicas"] == {"RUNNING": 2, "STARTING": 1}
    assert (sampler["min_replicas"], sampler["max_replicas"], sampler["in_flight"], sampler["max_pending"]) == (
        1,
        3,
        2,
        16,
    )


def test_replicas_are_null_when_serve_cannot_be_read() -> None:
    for replicas in (None, _Replicas({})):
        (model,) = status(replicas)["base_models"]
        assert model["sampler"]["replicas"] is None and model["trainers"][0]["replicas"] is None
