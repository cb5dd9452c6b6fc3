"""Structured request logs and the routing of our loggers into Serve's replica logger."""

from __future__ import annotations

import logging

import pytest

from app.config import redacted
from app.request_log import log_request, outcome_of
from deployments.logs import APP_LOGGER, SERVE_LOGGER, route_app_logs


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_request_log_line_carries_fields_as_text_and_attributes() -> None:
    logger, capture = logging.getLogger("tinker_serve.requests"), _Capture()
    logger.addHandler(capture)
    level = logger.level
    logger.setLevel(logging.INFO)  # setLevel, not .level: it clears the cached isEnabledFor answers of earlier calls
    try:
        log_request("queued", op="forward_backward", model_id="s1:train:0", seq_id=3, tinker_request_id="abc")
    finally:
        logger.removeHandler(capture)
        logger.setLevel(level)
    (record,) = capture.records
    assert record.getMessage() == "queued op=forward_backward model_id=s1:train:0 seq_id=3 tinker_request_id=abc"
    assert (record.model_id, record.seq_id, record.tinker_request_id) == ("s1:train:0", 3, "abc")


def test_outcome_names_the_error_category() -> None:
    assert outcome_of(None) == "ok"
    assert outcome_of({"error": "bad", "category": "user"}) == "user_error"
    assert outcome_of({"error": "boom"}) == "server_error"


def test_app_logs_reach_the_serve_logger_handlers() -> None:
    serve_logger, capture = logging.getLogger(SERVE_LOGGER), _Capture()
    serve_logger.addHandler(capture)
    app_logger = logging.getLogger(APP_LOGGER)
    saved = (app_logger.handlers[:], app_logger.level, app_logger.propagate, serve_logger.level)
    try:
        route_app_logs()
        route_app_logs()  # idempotent: one line per record
        serve_logger.setLevel(logging.INFO)
        logging.getLogger("tinker_serve.trainer").info("trainer %s ready", "t")
        serve_logger.setLevel(logging.WARNING)  # Serve's logging_config.log_level quiets our INFO lines too
        logging.getLogger("tinker_serve.requests").info("queued op=forward")
        logging.getLogger("tinker_serve.trainer").warning("worker group restarted")
    finally:
        serve_logger.removeHandler(capture)
        app_logger.handlers, app_logger.level, app_logger.propagate, serve_logger.level = saved
    assert [r.getMessage() for r in capture.records] == ["trainer t ready", "worker group restarted"]


@pytest.mark.parametrize(
    "url, shown",
    [
        ("postgresql+asyncpg://tinker:s3cr%40t@db:5432/tinker", "postgresql+asyncpg://tinker:***@db:5432/tinker"),
        ("sqlite+aiosqlite:////var/state/tinker_serve.db", "sqlite+aiosqlite:////var/state/tinker_serve.db"),
        (
            "s3://b/p?region=us-east-1&secret_key=abc&access_key=AKIA1",
            "s3://b/p?region=us-east-1&secret_key=***&access_key=***",
        ),
        (
            "s3://b/p?endpoint_override=127.0.0.1:9000&scheme=http",
            "s3://b/p?endpoint_override=127.0.0.1:9000&scheme=http",
        ),
    ],
)
def test_urls_are_redacted_for_logs(url: str, shown: str) -> None:
    assert redacted(url) == shown


def test_serve_log_file_survives_a_dictconfig(tmp_path) -> None:
    """vLLM's engine start calls logging.config.dictConfig, which closes every handler in the process."""
    import logging.config
    import logging.handlers

    from deployments.logs import serve_log_file_kept

    log_file = tmp_path / "replica.log"
    buffer = logging.handlers.MemoryHandler(1, target=logging.FileHandler(log_file))
    serve_logger = logging.getLogger(SERVE_LOGGER)
    serve_logger.addHandler(buffer)
    try:
        with serve_log_file_kept():
            logging.config.dictConfig({"version": 1, "disable_existing_loggers": False})
        serve_logger.warning("after the engine started")
    finally:
        serve_logger.removeHandler(buffer)
    assert "after the engine started" in log_file.read_text()
