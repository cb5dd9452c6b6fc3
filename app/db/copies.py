"""copy_weights requests by their X-Idempotency-Key: a retry (the SDK keeps one key across its retries) answers
the first copy's path instead of copying again or colliding with that copy. And the bytes of the copies under way on
this replica, by user: held against their checkpoint-byte quota until the copy's row counts in the database."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from sqlalchemy import insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.schema import copy_requests


class CopyLog:
    def __init__(self, db: AsyncEngine) -> None:
        self._db = db
        self._under_way: dict[str, int] = {}  # user -> bytes of their copies under way here
        self._admission = asyncio.Lock()  # one admission at a time: each sees the bytes of those before it

    @asynccontextmanager
    async def reserved(self, user: str, nbytes: int, room: Callable[[int], Awaitable[None]]) -> AsyncIterator[None]:
        """Hold `nbytes` of `user`'s quota while a copy is made and recorded. `room(held)` raises when the user's
        recorded bytes plus `held` (their other copies under way) plus `nbytes` do not fit; admissions take turns,
        so concurrent copies cannot all pass. `held` is read before `room` reads the database: a copy that ends
        meanwhile counts in one or both, never in neither."""
        async with self._admission:
            await room(self._under_way.get(user, 0))
            self._under_way[user] = self._under_way.get(user, 0) + nbytes
        try:
            yield
        finally:
            left = self._under_way.pop(user, 0) - nbytes
            if left:
                self._under_way[user] = left

    async def find(self, key: str) -> str | None:
        """The tinker path the copy with this key made, if one did."""
        async with self._db.connect() as conn:
            return await conn.scalar(select(copy_requests.c.tinker_path).where(copy_requests.c.idempotency_key == key))

    async def remember(self, key: str, tinker_path: str) -> None:
        try:
            async with self._db.begin() as conn:
                await conn.execute(
                    insert(copy_requests).values(idempotency_key=key, tinker_path=tinker_path, created_at=time.time())
                )
        except IntegrityError:  # a concurrent retry of the same key copied too; the first answer stands
            pass
