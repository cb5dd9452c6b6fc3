"""call_with_retries: only the named errors are retried, at most `retries` times, within the deadline, and only
while the caller still wants the answer."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import pytest

from app import retry
from app.retry import NO_RETRIES, RetriesExhausted, RetryPolicy, call_with_retries


class Gone(Exception):
    """Stands for a dead replica."""


def _calls(*outcomes: BaseException | str | None) -> tuple[list[float], Callable[[], Awaitable[str]]]:
    """A call that raises or returns each outcome in turn (None: never answers); and when each call began."""
    started: list[float] = []

    async def call() -> str:
        outcome = outcomes[len(started)]
        started.append(time.monotonic())
        if outcome is None:
            await asyncio.Event().wait()
        if isinstance(outcome, BaseException):
            raise outcome
        assert isinstance(outcome, str)
        return outcome

    return started, call


def _run(call: Callable[[], Awaitable[str]], policy: RetryPolicy, **kwargs) -> str:
    return asyncio.run(call_with_retries(call, retry_on=(Gone,), policy=policy, label="sample req-1", **kwargs))


@pytest.fixture(autouse=True)
def _short_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retry, "FIRST_BACKOFF_S", 0.05)


def test_a_retryable_error_is_retried_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    started, call = _calls(Gone("replica died"), Gone("again"), "sampled")
    with caplog.at_level(logging.WARNING, logger="tinker_serve.retry"):
        assert _run(call, RetryPolicy(retries=3, deadline_s=10)) == "sampled"
    assert len(started) == 3
    # each record once: after an in-process replica set-up (deployments.logs) a record also reaches the root logger
    # through Serve's logger
    records = list({id(r): r for r in caplog.records}.values())
    assert [r.levelno for r in records] == [logging.WARNING] * 2
    assert "sample req-1" in records[0].getMessage() and "retry 1 of 3" in records[0].getMessage()
    assert started[2] - started[1] > started[1] - started[0] >= 0.05  # the backoff doubles


def test_other_errors_are_not_retried() -> None:
    started, call = _calls(ValueError("bad request"), "never")
    with pytest.raises(ValueError, match="bad request"):
        _run(call, RetryPolicy(retries=3, deadline_s=10))
    assert len(started) == 1


def test_retries_are_bounded() -> None:
    started, call = _calls(Gone("1"), Gone("2"), Gone("3"), "never")
    with pytest.raises(RetriesExhausted, match="failed 3 times") as info:
        _run(call, RetryPolicy(retries=2, deadline_s=10))
    assert len(started) == 3 and str(info.value.__cause__) == "3"


def test_no_retries_raises_the_error_itself() -> None:
    started, call = _calls(Gone("died"), "never")
    with pytest.raises(Gone):
        _run(call, NO_RETRIES)
    assert len(started) == 1


def test_a_retry_that_never_answers_ends_at_the_deadline() -> None:
    started, call = _calls(Gone("died"), None)
    with pytest.raises(RetriesExhausted, match=r"no answer within 0\.5 s") as info:
        _run(call, RetryPolicy(retries=3, deadline_s=0.5))
    assert isinstance(info.value.__cause__, Gone)
    assert len(started) == 2 and 0.45 < time.monotonic() - started[0] < 1.5


def test_no_retry_starts_when_its_backoff_would_pass_the_deadline() -> None:
    started, call = _calls(Gone("died"), "never")
    with pytest.raises(RetriesExhausted, match="no time left"):
        _run(call, RetryPolicy(retries=3, deadline_s=0.01))
    assert len(started) == 1


def test_a_call_no_longer_wanted_is_not_retried() -> None:
    started, call = _calls(Gone("died"), "never")

    async def answered_meanwhile() -> bool:
        return False

    with pytest.raises(Gone):
        _run(call, RetryPolicy(retries=3, deadline_s=10), worth_retrying=answered_meanwhile)
    assert len(started) == 1


def test_a_calls_own_timeout_is_not_the_deadline() -> None:
    started, call = _calls(Gone("died"), TimeoutError("the call's own"))
    with pytest.raises(TimeoutError, match="the call's own"):
        _run(call, RetryPolicy(retries=3, deadline_s=10))
    assert len(started) == 2
