"""Prometheus metrics through Ray's metrics API: every node's metrics agent exports them (with Ray Serve's own
replica and request metrics) on Ray's metrics endpoint. Names start with `tinker_serve_`; Ray adds `ray_`.

Created lazily, once per process, inside Ray actors (the ingress, trainer and sampler replicas). Every label's values
are bounded: routes by their template, trainers and base models by the configuration, and the two labels that would
grow with the users and their models (`user`, `model_id`) through `LabelValues`: `all` unless the config's `metrics`
section turns them on, and then at most `metrics.max_label_values` names per process, the rest `other`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import cache
from typing import Any

from ray.util import metrics

from app.config_sections import MetricsConfig

_SECONDS = [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300]


class ServerMetrics:
    def __init__(self) -> None:
        self.requests = metrics.Counter(
            "tinker_serve_requests", "HTTP requests answered, by route and status code", tag_keys=("route", "status")
        )
        self.user_requests = metrics.Counter(
            "tinker_serve_user_requests",
            "HTTP requests answered, by user id (never by key; `all` unless metrics.per_user_labels) and status code",
            tag_keys=("user", "status"),
        )
        self.queue_depth = metrics.Gauge(
            "tinker_serve_queue_depth",
            "Training operations waiting for their turn, per trainer and model (`all` unless metrics.per_model_labels)",
            tag_keys=("trainer", "model_id"),
        )
        self.op_seconds = metrics.Histogram(
            "tinker_serve_training_op_seconds",
            "Worker-group time of a training operation's run, by operation",
            boundaries=_SECONDS,
            tag_keys=("trainer", "op"),
        )
        self.tokens = metrics.Counter(
            "tinker_serve_tokens",
            "Tokens processed: `trained` (forward_backward inputs) or `sampled`",
            tag_keys=("name", "kind"),
        )  # name: a trainer or a base model
        self.snapshots = metrics.Counter(
            "tinker_serve_snapshots", "Snapshots of live models taken unasked, per trainer", tag_keys=("trainer",)
        )
        self.snapshot_capture_seconds = metrics.Histogram(
            "tinker_serve_snapshot_capture_seconds",
            "Worker-group time of the run that took a snapshot (its copying holds up training; writing does not)",
            boundaries=_SECONDS,
            tag_keys=("trainer",),
        )
        self.recoveries = metrics.Histogram(
            "tinker_serve_recovery_seconds",
            "Time to rebuild a trainer's models after its workers (or the trainer) restarted",
            boundaries=_SECONDS,
            tag_keys=("trainer",),
        )
        self.replayed_ops = metrics.Counter(
            "tinker_serve_replayed_ops", "Journaled operations replayed to rebuild models", tag_keys=("trainer",)
        )
        self.db_statements = metrics.Counter(
            "tinker_serve_db_statements",
            "Statements sent to the metadata database, by process and statement (`select futures`, ...)",
            tag_keys=("process", "statement"),
        )
        self.adapter_loads = metrics.Counter(
            "tinker_serve_adapter_loads", "LoRA adapters loaded into a sampler's engine", tag_keys=("base_model",)
        )


ALL = "all"  # an unbounded label turned off: every user (or model) in one series
OTHER = "other"  # an unbounded label's values past its cap, in one series


class LabelValues:
    """The values one unbounded label (a user id, a model id) takes in this process's metrics. Off: `all`, one series
    for everyone. On: each value as it is for the first `cap` distinct values this process labels, then `other`; a
    value keeps its series once it has one. Each series lives in Prometheus for its retention whether or not it is
    still written, so the label's series stay at most `cap` + 1 per process either way."""

    def __init__(self, enabled: bool = False, cap: int = 100) -> None:
        self._enabled = enabled
        self._cap = cap
        self._named: set[str] = set()

    @classmethod
    def users(cls, config: MetricsConfig) -> LabelValues:
        """The `user` label as `config` sets it (`per_user_labels`, `max_label_values`)."""
        return cls(config.per_user_labels, config.max_label_values)

    @classmethod
    def models(cls, config: MetricsConfig) -> LabelValues:
        """The `model_id` label as `config` sets it (`per_model_labels`, `max_label_values`)."""
        return cls(config.per_model_labels, config.max_label_values)

    def __call__(self, value: str) -> str:
        if not self._enabled:
            return ALL
        if value in self._named:
            return value
        if len(self._named) < self._cap:
            self._named.add(value)
            return value
        return OTHER


class QueueDepths:
    """One trainer's `tinker_serve_queue_depth`: each model's operations waiting for their turn, under its `model_id`
    label's value. A value that stands for several models (`all`, `other`) reads their sum, and one whose models have
    nothing waiting reads 0."""

    def __init__(self, trainer: str, models: LabelValues) -> None:
        self._trainer = trainer
        self._models = models
        self._waiting: dict[str, int] = {}  # models with operations waiting
        self._shown: set[str] = set()  # the label values whose series were set so far

    def set(self, model_id: str, waiting: int) -> None:
        """`model_id` has `waiting` operations waiting now (0 when it has none or is gone)."""
        if waiting:
            self._waiting[model_id] = waiting
        else:
            self._waiting.pop(model_id, None)
        totals = dict.fromkeys([*self._shown, self._models(model_id)], 0)
        for model, count in self._waiting.items():
            totals[self._models(model)] += count
        gauge = server_metrics().queue_depth
        for label, total in totals.items():  # each time, unchanged ones too: Ray's exporter drops a stale gauge
            gauge.set(total, tags={"trainer": self._trainer, "model_id": label})
            self._shown.add(label)


@cache
def server_metrics() -> ServerMetrics:
    """This process's metrics (one registration per process)."""
    return ServerMetrics()


class RequestMetrics:
    """ASGI middleware counting answered requests by route template (never the raw path: ids would explode
    the label set) and status code, and by user (app.api.gate.RequestGate sets it; requests that need no key, or
    whose key was refused, count as `none`) as `users` labels them (by default every user is `all`)."""

    def __init__(self, app: Callable[..., Awaitable[None]], users: LabelValues | None = None) -> None:
        self.app = app
        self.users = users or LabelValues()

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def record_status(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, record_status)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            server_metrics().requests.inc(tags={"route": route, "status": str(status)})
            user = self.users(scope.get("state", {}).get("user") or "none")
            server_metrics().user_requests.inc(tags={"user": user, "status": str(status)})
