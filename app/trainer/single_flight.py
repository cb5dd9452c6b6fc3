"""One run per request id: a call that arrives while the same request runs waits for that run instead."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable


class SingleFlight:
    """Runs `work` for a key unless it already runs for that key; a second caller waits for the first run.

    The trainer gets the same request twice when Serve delivers a call the previous replica never answered after
    the new replica already reran it from the journal."""

    def __init__(self) -> None:
        self._running: dict[str, asyncio.Future[None]] = {}

    async def run(self, key: str, work: Callable[[], Awaitable[None]]) -> None:
        first = self._running.get(key)
        if first is not None:
            await asyncio.shield(first)
            return
        self._running[key] = done = asyncio.get_running_loop().create_future()
        try:
            await work()
        finally:
            del self._running[key]
            done.set_result(None)
