"""forward(_backward) bodies decoded off the event loop, a few at a time per user.

Decompressing a body and reading its model_id and seq_id (upb skips the datums unread) run in a thread; the full
decode, whose cost grows with the body (upb's parse, json.loads and numpy hold the GIL for all of it), runs in a
small pool of processes of the ingress replica (`quotas.decode_processes`, dying with it: app.orphans), so the
event loop answers other users meanwhile. A user has at most `quotas.max_concurrent_decodes_per_user` bodies
decoding at once; their others wait their turn, and the other users' bodies are decoded by the processes they leave
free.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
from collections.abc import AsyncIterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import asynccontextmanager

from app.config import QuotasConfig
from app.errors import ServerError
from app.orphans import die_with_parent
from app.protocol.codec import Bounds, Outcome, decode_plain

__all__ = ["Decoders", "decoders"]


class Decoders:
    """The decoding processes of one ingress replica and each user's turns at them."""

    def __init__(self, processes: int) -> None:
        self.processes = processes
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()  # submits come from threads
        self._turns: dict[str, tuple[asyncio.Semaphore, int]] = {}  # user -> (their turns, requests holding one)

    @asynccontextmanager
    async def turn(self, user: str, turns: int) -> AsyncIterator[None]:
        """Hold one of `user`'s `turns` decoding turns (waiting for one); the user's entry goes with their last
        request (a changed `turns` applies from then)."""
        semaphore, holders = self._turns.get(user, (asyncio.Semaphore(turns), 0))
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
        """decode_plain in one of the processes (call it during a `turn`). Submitted from a thread: a submit may
        start a process (a fork of this replica, then an exec), which must not hold up the event loop."""
        try:
            job = await asyncio.to_thread(self._submit, plain, json_body, bounds)
            return await asyncio.wrap_future(job)
        except BrokenProcessPool as exc:  # a process was killed (for memory, most likely): the next call starts anew
            self._pool = None
            raise ServerError("the process decoding this request died; retry it") from exc

    def _submit(self, plain: bytes, json_body: bool, bounds: Bounds) -> Future[Outcome]:
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(
                    self.processes, mp_context=multiprocessing.get_context("spawn"), initializer=die_with_parent
                )
            return self._pool.submit(decode_plain, plain, json_body, bounds)


_decoders: dict[int, Decoders] = {}


def decoders(quotas: QuotasConfig) -> Decoders:
    """The replica's Decoders of quotas.decode_processes (one per process: its pool and turns outlive requests)."""
    if quotas.decode_processes not in _decoders:
        _decoders[quotas.decode_processes] = Decoders(quotas.decode_processes)
    return _decoders[quotas.decode_processes]
