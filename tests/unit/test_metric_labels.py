"""Bounded metric labels (app/metrics.py): the `user` and `model_id` labels are `all` unless the config's `metrics`
section turns them on, and then name at most `metrics.max_label_values` values per process, the rest `other`; the
queue-depth gauge sums the models a label value stands for; the request middleware labels users that way."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

import pytest
from pydantic import ValidationError

from app import metrics
from app.config import MetricsConfig, ServerConfig
from app.metrics import ALL, OTHER, LabelValues, QueueDepths, RequestMetrics

TINY = {"name": "tinker-serve/tiny", "path": "models/tiny", "embedded_preset": "tiny"}


class _Recorded:
    """A stand-in for a Ray gauge or counter: the last value set, and the sum of increments, per tag set."""

    def __init__(self) -> None:
        self.values: dict[tuple[tuple[str, str], ...], float] = {}
        self.counts: dict[tuple[tuple[str, str], ...], float] = defaultdict(float)

    def set(self, value: float, tags: dict[str, str]) -> None:
        self.values[tuple(sorted(tags.items()))] = value

    def inc(self, value: float = 1.0, tags: dict[str, str] | None = None) -> None:
        self.counts[tuple(sorted((tags or {}).items()))] += value


class _Metrics:
    def __init__(self) -> None:
        self.queue_depth = _Recorded()
        self.requests = _Recorded()
        self.user_requests = _Recorded()


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> _Metrics:
    fake = _Metrics()
    monkeypatch.setattr(metrics, "server_metrics", lambda: fake)
    return fake


def _depth(recorded: _Metrics, model_id: str, trainer: str = "t") -> float:
    return recorded.queue_depth.values[(("model_id", model_id), ("trainer", trainer))]


def test_the_labels_are_off_by_default() -> None:
    config = ServerConfig.model_validate({"base_models": [TINY], "auth": {"mode": "any_tml_key_on_loopback"}}).metrics
    assert config == MetricsConfig() and not config.per_user_labels and not config.per_model_labels
    users, models = LabelValues.users(config), LabelValues.models(config)
    assert {users(f"user-{i}") for i in range(500)} == {ALL}
    assert {models(f"model-{i}") for i in range(500)} == {ALL}


def test_a_label_turned_on_names_its_first_values_then_folds_the_rest_into_other() -> None:
    users = LabelValues.users(MetricsConfig(per_user_labels=True, max_label_values=2))
    assert [users(u) for u in ("a", "b", "c", "a", "d", "b")] == ["a", "b", OTHER, "a", OTHER, "b"]
    models = LabelValues.models(MetricsConfig(per_model_labels=True, max_label_values=1))
    assert [models(m) for m in ("m1", "m2", "m1")] == ["m1", OTHER, "m1"]
    assert LabelValues.users(MetricsConfig(per_model_labels=True))("u") == ALL  # each label is turned on by itself


def test_the_metrics_section_is_checked() -> None:
    base = {"base_models": [TINY], "auth": {"mode": "any_tml_key_on_loopback"}}
    on = ServerConfig.model_validate({**base, "metrics": {"per_user_labels": True, "max_label_values": 5}})
    assert on.metrics.per_user_labels and on.metrics.max_label_values == 5
    with pytest.raises(ValidationError, match=r"metrics\.max_label_values"):
        ServerConfig.model_validate({**base, "metrics": {"max_label_values": 0}})
    with pytest.raises(ValidationError, match=r"metrics\.per_user_label"):
        ServerConfig.model_validate({**base, "metrics": {"per_user_label": True}})  # a misspelt key


def test_queue_depth_sums_the_models_under_all_when_the_label_is_off(recorded: _Metrics) -> None:
    depths = QueueDepths("t", LabelValues())
    depths.set("m1", 3)
    depths.set("m2", 4)
    assert recorded.queue_depth.values == {(("model_id", ALL), ("trainer", "t")): 7}
    depths.set("m1", 0)
    assert _depth(recorded, ALL) == 4
    depths.set("m2", 0)
    assert _depth(recorded, ALL) == 0


def test_queue_depth_names_models_up_to_the_cap_and_sums_the_rest_under_other(recorded: _Metrics) -> None:
    depths = QueueDepths("t", LabelValues(enabled=True, cap=2))
    for model, waiting in (("m1", 1), ("m2", 2), ("m3", 3), ("m4", 4)):
        depths.set(model, waiting)
    labels = {dict(tags)["model_id"] for tags in recorded.queue_depth.values}
    assert labels == {"m1", "m2", OTHER}
    assert (_depth(recorded, "m1"), _depth(recorded, "m2"), _depth(recorded, OTHER)) == (1, 2, 7)
    depths.set("m3", 0)  # drained (or unloaded): its share of `other` goes
    assert _depth(recorded, OTHER) == 4
    depths.set("m1", 0)
    assert _depth(recorded, "m1") == 0  # a named model with nothing waiting reads 0, not its last value


def _request(app: RequestMetrics, user: str | None) -> None:
    async def send(_: dict[str, Any]) -> None:
        return None

    async def receive() -> dict[str, Any]:
        return {"type": "http.request"}

    scope = {"type": "http", "state": {"user": user} if user else {}}
    asyncio.run(app(scope, receive, send))


async def _answer(scope: dict, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200})


def test_requests_count_every_user_as_all_by_default(recorded: _Metrics) -> None:
    app = RequestMetrics(_answer)
    for user in ("u1", "u2", None):
        _request(app, user)
    assert dict(recorded.user_requests.counts) == {(("status", "200"), ("user", ALL)): 3}


def test_requests_by_user_when_on_are_capped(recorded: _Metrics) -> None:
    app = RequestMetrics(_answer, users=LabelValues.users(MetricsConfig(per_user_labels=True, max_label_values=2)))
    for user in ("u1", "u2", "u3", "u1", None):
        _request(app, user)
    by_user = {dict(tags)["user"]: count for tags, count in recorded.user_requests.counts.items()}
    assert by_user == {"u1": 2, "u2": 1, OTHER: 2}  # u3 and the keyless request (`none`) came after the cap
