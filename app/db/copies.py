"""copy_weights requests by their X-Idempotency-Key: a retry (the SDK keeps one key across its retries) answers
the first copy's path instead of copying again or colliding with that copy."""

from __future__ import annotations

import time

from sqlalchemy import insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.schema import copy_requests


class CopyLog:
    def __init__(self, db: AsyncEngine) -> None:
        self._db = db

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
