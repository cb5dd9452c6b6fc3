"""forward(_backward) bodies decoded off the event loop, a few at a time per user.

Decompressing a body and reading its model_id and seq_id (upb skips the datums unread) run in a thread; the full
decode, whose cost grows with the body (upb's parse, json.loads and numpy hold the GIL for all of it), runs in a
small pool of processes of the ingress replica (`quotas.decode_processes`), so the event loop answers other users
meanwhile. A user has at most `quotas.max_concurrent_decodes_per_user` bodies decoding at once; their others wait
their turn, and the other users' bodies are decoded by the processes they leave free.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import AsyncIterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import asynccontextmanager

from app.config import QuotasConfig
from app.errors import ServerError
from app.protocol.codec import Bounds, Outcome, decode_plain

__all__ = ["Decoders", "decoders"]


class Decoders:
    """The decoding processes of one ingress replica and each user's turns at them."""

    def __init__(self, processes: int, per_user: int) -> None:
        self.processes, self.per_user = processes, per_user
        self._pool: ProcessPoolExecutor | None = None
        self._turns: dict[str, tuple[asyncio.Semaphore, int]] = {}  # user -> (their turns, requests holding one)

    @asynccontextmanager
    async def turn(self, user: str) -> AsyncIterator[None]:
        """Hold one of `user`'s decoding turns (waiting for one); the user's entry goes with their last request."""
        semaphore, holders = self._turns.get(user, (asyncio.Semaphore(self.per_user), 0))
        self._turns[user] = (semaphore, holders + 1)
        try:
            async with semaphore:
                yield
        finally:
            semaphore, holders = self._turns[user]
            if holders == 1:
                del self._turns[user]
            else:
                self._turns[user] = (semaphore, holders - 1)

    async def decode(self, plain: bytes, json_body: bool, bounds: Bounds) -> Outcome:
        """decode_plain in one of the processes (call it during a `turn`)."""
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.processes, mp_context=multiprocessing.get_context("spawn"))
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, decode_plain, plain, json_body, bounds)
        except BrokenProcessPool as exc:  # a process was killed (for memory, most likely): the next call starts anew
            self._pool = None
            raise ServerError("the process decoding this request died; retry it") from exc


_decoders: dict[tuple[int, int], Decoders] = {}


def decoders(quotas: QuotasConfig) -> Decoders:
    """The replica's Decoders for these quotas (one per process: its pool and turns outlive requests)."""
    key = (quotas.decode_processes, quotas.max_concurrent_decodes_per_user)
    if key not in _decoders:
        _decoders[key] = Decoders(*key)
    return _decoders[key]
