"""Our loggers (`tinker_serve.*`) write through the replica's Serve logger: into the replica's log file under
`logs/serve/` (text, or JSON per the app's `logging_config`, with Serve's request id, route and replica) and to
stderr, which `serve run` shows. Without this, their INFO lines would go nowhere."""

from __future__ import annotations

import logging
import logging.handlers
from collections.abc import Iterator
from contextlib import contextmanager

APP_LOGGER = "tinker_serve"
SERVE_LOGGER = "ray.serve"


class _ToServeLogger(logging.Handler):
    """Hands records to Serve's logger at emit time, so a reconfigured Serve logger is followed (its level too:
    `logging_config: {log_level: WARNING}` quiets the per-request lines)."""

    def emit(self, record: logging.LogRecord) -> None:
        serve_logger = logging.getLogger(SERVE_LOGGER)
        if serve_logger.isEnabledFor(record.levelno):
            serve_logger.handle(record)


def route_app_logs() -> None:
    """Call once in each replica's constructor (idempotent)."""
    app_logger = logging.getLogger(APP_LOGGER)
    if not any(isinstance(handler, _ToServeLogger) for handler in app_logger.handlers):
        app_logger.addHandler(_ToServeLogger())
    app_logger.setLevel(logging.INFO)
    app_logger.propagate = False


@contextmanager
def serve_log_file_kept() -> Iterator[None]:
    """Around vLLM's engine start: vLLM configures logging with `dictConfig`, which closes every handler in the
    process, and Serve's replica log file (behind a MemoryHandler) went silent for good. Reattach it after."""
    buffers = [
        (handler, handler.target)
        for handler in logging.getLogger(SERVE_LOGGER).handlers
        if isinstance(handler, logging.handlers.MemoryHandler)
    ]
    try:
        yield
    finally:
        for handler, target in buffers:
            if handler.target is None:
                handler.setTarget(target)
