"""Calling again after a failure that says nothing about the request (the process that ran it died)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

logger = logging.getLogger("tinker_serve.retry")

T = TypeVar("T")

FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 5.0


@dataclass(frozen=True)
class RetryPolicy:
    """At most `retries` calls after the first, all started and finished within `deadline_s` of its failure."""

    retries: int
    deadline_s: float


NO_RETRIES = RetryPolicy(retries=0, deadline_s=0.0)


class RetriesExhausted(Exception):
    """The call failed in a retryable way and its retries ran out (in number or in time)."""


async def _always() -> bool:
    return True


async def call_with_retries(
    call: Callable[[], Awaitable[T]],
    *,
    retry_on: tuple[type[BaseException], ...],
    policy: RetryPolicy,
    label: str,
    worth_retrying: Callable[[], Awaitable[bool]] = _always,
) -> T:
    """`call()`, called again (after a doubling pause) while it raises one of `retry_on` and `worth_retrying()`
    agrees. Any other error ends it at once, as does a decline (raising the last error); retries that run out,
    in number or in time, raise RetriesExhausted caused by the last error. `label` names the call in logs."""
    try:
        return await call()
    except retry_on as exc:
        error: BaseException = exc
    if not policy.retries:
        raise error
    loop = asyncio.get_running_loop()
    deadline = loop.time() + policy.deadline_s
    for retry in range(1, policy.retries + 1):
        if not await worth_retrying():
            raise error
        pause = min(FIRST_BACKOFF_S * 2 ** (retry - 1), MAX_BACKOFF_S)
        if loop.time() + pause >= deadline:
            raise RetriesExhausted(f"{label}: no time left for retry {retry} ({error!r})") from error
        logger.warning("%s failed (%r); retry %d of %d in %.1f s", label, error, retry, policy.retries, pause)
        await asyncio.sleep(pause)
        try:
            async with asyncio.timeout_at(deadline) as timer:
                return await call()
        except retry_on as exc:
            error = exc
        except TimeoutError:
            if not timer.expired():  # the call's own timeout, not the deadline
                raise
            raise RetriesExhausted(
                f"{label}: retry {retry} got no answer within {policy.deadline_s:g} s of the first failure ({error!r})"
            ) from error
    raise RetriesExhausted(f"{label}: failed {policy.retries + 1} times ({error!r})") from error
