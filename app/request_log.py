"""One structured log line per request event, so operators can follow a model's seq_ids across replicas.

The line reads `event key=value ...`; the same fields are record attributes, which become top-level keys in
Serve's JSON logs (`logging_config: {encoding: JSON}`). `tinker_request_id` is the future's id, the
`request_id` the SDK polls (Serve's own `request_id` is the HTTP request's)."""

from __future__ import annotations

import logging

logger = logging.getLogger("tinker_serve.requests")


def log_request(event: str, **fields: object) -> None:
    if logger.isEnabledFor(logging.INFO):
        logger.info("%s %s", event, " ".join(f"{key}={value}" for key, value in fields.items()), extra=fields)


def outcome_of(error: dict | None) -> str:
    """`ok`, or the failed future's category: `user_error` / `server_error`."""
    return "ok" if error is None else f"{error.get('category', 'server')}_error"
