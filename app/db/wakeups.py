"""Long-polls of database rows: a waiter re-reads until its read is done or its time is up, woken at once when
this process changes the row (`wake`), otherwise re-reading quickly at first and then less often, so many
concurrent long-polls do not load the database."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


class Wakeups(Generic[K]):
    def __init__(self, poll_interval_s: float) -> None:
        self._poll_interval_s = poll_interval_s
        self._events: dict[K, asyncio.Event] = {}
        self._waiters: dict[K, int] = {}  # the event is dropped when its last waiter leaves

    def wake(self, key: K) -> None:
        """Wake this process's waiters of `key`."""
        event = self._events.get(key)
        if event is not None:
            event.set()

    async def poll(self, key: K, read: Callable[[], Awaitable[T]], done: Callable[[T], bool], timeout_s: float) -> T:
        """The first `read()` that is `done`, or the last one once `timeout_s` has passed."""
        deadline = time.monotonic() + timeout_s
        self._waiters[key] = self._waiters.get(key, 0) + 1
        interval = self._poll_interval_s / 16  # doubles up to poll_interval_s
        try:
            while True:
                event = self._events.setdefault(key, asyncio.Event())
                event.clear()  # set again by any wake after this read starts
                value = await read()
                remaining = deadline - time.monotonic()
                if done(value) or remaining <= 0:
                    return value
                try:
                    await asyncio.wait_for(event.wait(), min(interval, remaining))
                except TimeoutError:
                    interval = min(2 * interval, self._poll_interval_s)
        finally:
            self._waiters[key] -= 1
            if not self._waiters[key]:
                del self._waiters[key]
                self._events.pop(key, None)
