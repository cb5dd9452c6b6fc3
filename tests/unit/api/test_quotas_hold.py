"""Quotas that hold against a user who games their order, through the in-process app (tests/unit/api/conftest.py):
past the pending quotas only the seq_id a model's pending operations wait for is admitted (not every seq_id below
them, counted down from a far one); the hand-over sweep loads, off the event loop, only the operations a trainer
says it lacks; concurrent copy_weights each reserve their bytes, so only those that fit the checkpoint-byte quota
pass."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from app.api.handover import hand_over_again
from app.db import journal_codec
from app.messages import AdamParams
from app.operations.optim_step import OptimStep
from tests.unit.api.conftest import InProcessApi, new_session, saved_checkpoint
from tests.unit.api.test_hostile_inputs import refused
from tests.unit.api.test_request_gate import _forward_backward


class _Trainers:
    """The trainers as the ingress sees them: what was submitted, and which seq_ids the trainer lacks."""

    def __init__(self, lacks: set[int] | None = None) -> None:
        self.submitted: list[tuple[int, Any]] = []
        self.lacks = lacks or set()

    def submit(self, trainer: str, model_id: str, seq_id: int, op: Any, user: str) -> None:
        self.submitted.append((seq_id, op))

    async def missing(self, trainer: str, model_id: str, seq_ids: list[int]) -> list[int]:
        return [seq_id for seq_id in seq_ids if seq_id in self.lacks]


def _live_model(api: InProcessApi) -> str:
    """A model of alice's whose creation (seq_id 0) completed, as create_model leaves it."""
    model_id = saved_checkpoint(api, "alice").model_id
    request_id, _ = api.run(api.services.futures.create("create_model", model_id, 0))
    api.run(api.services.futures.complete(request_id, b"{}", "application/json"))
    return model_id


def _step(model_id: str, seq_id: int) -> dict:
    return {"model_id": model_id, "seq_id": seq_id, "adam_params": {"learning_rate": 1e-3}}


@pytest.mark.parametrize(
    ("limit", "route", "body"),
    [
        ({"max_pending_requests_per_user": 4}, "optim_step", _step),
        ({"max_pending_bytes_per_user": 40 * 1024}, "forward_backward", lambda m, s: _forward_backward(m, s, 4)),
    ],
)
def test_a_count_down_is_held_to_the_pending_quotas(
    make_api: Callable[..., InProcessApi], limit: dict, route: str, body: Callable[[str, int], dict]
) -> None:
    """seq_ids counted down from 1000 each come before every pending one, and none is what the model waits for
    (seq_id 1): past the quota they are refused; seq_id 1 is still admitted, then 2 once 1 has run."""
    api = make_api(**limit)
    api.services.trainers = trainers = _Trainers()  # type: ignore[assignment]
    model_id = _live_model(api)
    name = next(iter(limit))

    def send(seq_id: int) -> Any:
        return api.post(f"/api/v1/{route}", body(model_id, seq_id))

    admitted = 0
    while (answer := send(1000 - admitted)).status_code == 200 and admitted < 10:
        admitted += 1
    assert admitted == (4 if name == "max_pending_requests_per_user" else 2)  # 16 KiB each within 40 KiB
    assert answer.status_code == 429 and f"quotas.{name}" in answer.json()["error"], answer.text
    assert int(answer.headers["retry-after"]) >= 1
    first = send(1)  # what the pending ones wait for
    assert first.status_code == 200, first.text
    assert send(2).status_code == 429  # not awaited: 1 is pending and runs first
    api.run(api.services.futures.complete(first.json()["request_id"], b"{}", "application/json"))
    assert send(2).status_code == 200  # now the one awaited
    assert [seq_id for seq_id, _ in trainers.submitted] == [*range(1000, 1000 - admitted, -1), 1, 2]


def test_the_hand_over_sweep_loads_only_what_a_trainer_lacks(
    api: InProcessApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pending operations are read as ids; only the one the trainer lacks is loaded, decoded off the event loop,
    and handed over."""
    api.services.trainers = trainers = _Trainers(lacks={2})  # type: ignore[assignment]
    model_id = _live_model(api)
    for seq_id in (1, 2, 3):
        request_id, _ = api.run(api.services.futures.create("optim_step", model_id, seq_id))
        api.run(api.services.journal.append(model_id, seq_id, OptimStep(request_id, AdamParams(learning_rate=1.0))))
    decoded_on: list[int] = []
    decode = journal_codec.decode

    def counted(blob: bytes) -> Any:
        decoded_on.append(threading.get_ident())
        return decode(blob)

    monkeypatch.setattr(journal_codec, "decode", counted)

    async def loop_thread() -> int:
        return threading.get_ident()

    assert api.run(hand_over_again(api.services, pending_s=0)) == 1
    assert [seq_id for seq_id, _ in trainers.submitted] == [2]
    assert len(decoded_on) == 1  # not the batches of 1 and 3, which the trainer holds
    assert api.run(loop_thread()) not in decoded_on


def test_concurrent_copies_reserve_their_bytes(make_api: Callable[..., InProcessApi]) -> None:
    """Copies of bob's published 1000-byte checkpoint against alice's 2500 bytes: one copied, one refused by a
    name collision (its bytes given back), then six at once: one more fits, the others are refused naming the
    quota."""
    api = make_api(max_checkpoint_bytes_per_user=2500)
    source = saved_checkpoint(api, "bob", size_bytes=1000, public=True)
    body = {"source_path": source.uri}
    into = {**body, "session_id": new_session(api), "model_seq_id": 0}
    assert api.post("/api/v1/copy_weights", into).status_code == 200
    assert "already exists" in refused(api.post("/api/v1/copy_weights", into), "model_seq_id")["error"]

    async def copies(count: int) -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=api.client.app, client=("127.0.0.1", 40000))  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as http:
            sends = [http.post("/api/v1/copy_weights", json=body, headers=api.headers()) for _ in range(count)]
            return list(await asyncio.gather(*sends))

    answers = api.run(copies(6))
    assert sorted(a.status_code for a in answers) == [200, 400, 400, 400, 400, 400], [a.text for a in answers]
    for answer in answers:
        if answer.status_code == 400:
            assert "quotas.max_checkpoint_bytes_per_user=2500" in refused(answer, "source_path")["error"]
    assert api.run(api.services.quotas.checkpoint_bytes(api.user_id())) == 2000


def test_a_concurrent_burst_is_held_to_the_pending_quota(make_api: Callable[..., InProcessApi]) -> None:
    """Twenty optim_steps sent at once against a quota of 4 pending operations: the checks take turns and count the
    ones admitted before them, so 4 are admitted and the rest answer 429 naming the quota."""
    api = make_api(max_pending_requests_per_user=4)
    api.services.trainers = _Trainers()  # type: ignore[assignment]
    model_id = _live_model(api)

    async def burst(count: int) -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=api.client.app, client=("127.0.0.1", 40000))  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as http:
            sends = [
                http.post("/api/v1/optim_step", json=_step(model_id, 100 + i), headers=api.headers())
                for i in range(count)
            ]
            return list(await asyncio.gather(*sends))

    answers = api.run(burst(20))
    codes = [a.status_code for a in answers]
    assert codes.count(200) == 4 and codes.count(429) == 16, codes
    assert all("quotas.max_pending_requests_per_user" in a.json()["error"] for a in answers if a.status_code == 429)
    assert not api.services.admitting  # every place given back
