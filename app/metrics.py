"""Prometheus metrics through Ray's metrics API: every node's metrics agent exports them (with Ray Serve's own
replica and request metrics) on Ray's metrics endpoint. Names start with `tinker_serve_`; Ray adds `ray_`.

Created lazily, once per process, inside Ray actors (the ingress, trainer and sampler replicas)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import cache
from typing import Any

from ray.util import metrics

_SECONDS = [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300]


class ServerMetrics:
    def __init__(self) -> None:
        self.requests = metrics.Counter(
            "tinker_serve_requests", "HTTP requests answered, by route and status code", tag_keys=("route", "status")
        )
        self.user_requests = metrics.Counter(
            "tinker_serve_user_requests",
            "HTTP requests answered, by user id (never by key) and status code",
            tag_keys=("user", "status"),
        )
        self.queue_depth = metrics.Gauge(
            "tinker_serve_queue_depth",
            "Training operations waiting for their turn, per model",
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


@cache
def server_metrics() -> ServerMetrics:
    """This process's metrics (one registration per process)."""
    return ServerMetrics()


class RequestMetrics:
    """ASGI middleware counting answered requests by route template (never the raw path: ids would explode
    the label set) and status code, and by user (app.api.gate.RequestGate sets it; requests that need no key, or
    whose key was refused, count as `none`)."""

    def __init__(self, app: Callable[..., Awaitable[None]]) -> None:
        self.app = app

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
            user = scope.get("state", {}).get("user") or "none"
            server_metrics().user_requests.inc(tags={"user": user, "status": str(status)})
