"""Sampling sessions: which base model and which adapter (a storage location) a sampler id stands for.

Persistent sessions point at saved sampler weights; ephemeral ones (save_weights_and_get_sampling_client)
own their adapter's location and expire once unused for the configured TTL.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy import Row, delete, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.completions import insert_numbered
from app.db.schema import sampling_clients, sampling_sessions
from app.errors import NotFound


@dataclass(frozen=True)
class SamplingSession:
    sampling_session_id: str
    session_id: str
    base_model: str
    model_path: str | None  # tinker:// path, None for the base model
    adapter_location: str | None  # None for the base model
    ephemeral: bool
    last_used_at: float


def sampling_session_id_for(session_id: str, sampling_session_seq_id: int) -> str:
    """The conventional id the hosted service uses (and the SDK's examples expect)."""
    return f"{session_id}:sample:{sampling_session_seq_id}"


def sampler_not_found(sampling_session_id: str) -> NotFound:
    """What a sampling session that does not exist, or is another user's, answers."""
    return NotFound(
        f"sampling session {sampling_session_id!r} does not exist (or expired); create a new sampling client",
        field="sampling_session_id",
    )


def _from_row(row: Row) -> SamplingSession:
    return SamplingSession(
        sampling_session_id=row.sampling_session_id,
        session_id=row.session_id,
        base_model=row.base_model,
        model_path=row.model_path,
        adapter_location=row.adapter_location,
        ephemeral=bool(row.ephemeral),
        last_used_at=row.last_used_at,
    )


class SamplingSessionStore:
    def __init__(self, db: AsyncEngine) -> None:
        self._db = db

    async def create(self, session: SamplingSession) -> SamplingSession:
        """Insert; a retried create of the same id returns the stored session unchanged."""
        try:
            async with self._db.begin() as conn:
                await conn.execute(
                    insert(sampling_sessions).values(
                        sampling_session_id=session.sampling_session_id,
                        session_id=session.session_id,
                        base_model=session.base_model,
                        model_path=session.model_path,
                        adapter_location=session.adapter_location,
                        ephemeral=int(session.ephemeral),
                        created_at=time.time(),
                        last_used_at=session.last_used_at,
                    )
                )
            return session
        except IntegrityError:
            return await self.get(session.sampling_session_id)

    async def get(self, sampling_session_id: str) -> SamplingSession:
        async with self._db.connect() as conn:
            row = (
                await conn.execute(
                    select(sampling_sessions).where(sampling_sessions.c.sampling_session_id == sampling_session_id)
                )
            ).first()
        if row is None:
            raise sampler_not_found(sampling_session_id)
        return _from_row(row)

    async def join(self, sampling_session_id: str) -> int:
        """A new client id, unique within the sampling session: 1, 2, ... (its original client is 0)."""
        async with self._db.begin() as conn:
            key = {"sampling_session_id": sampling_session_id}
            return await insert_numbered(conn, sampling_clients, "client_counter", key)

    async def touch(self, sampling_session_id: str, now: float) -> None:
        async with self._db.begin() as conn:
            await conn.execute(
                update(sampling_sessions)
                .where(sampling_sessions.c.sampling_session_id == sampling_session_id)
                .values(last_used_at=now)
            )

    async def expired(self, ttl_s: float, now: float) -> list[SamplingSession]:
        """Ephemeral sessions unused for longer than `ttl_s`."""
        async with self._db.connect() as conn:
            rows = await conn.execute(
                select(sampling_sessions).where(
                    sampling_sessions.c.ephemeral == 1, sampling_sessions.c.last_used_at < now - ttl_s
                )
            )
            return [_from_row(row) for row in rows]

    async def delete(self, sampling_session_id: str) -> None:
        async with self._db.begin() as conn:
            await conn.execute(
                delete(sampling_sessions).where(sampling_sessions.c.sampling_session_id == sampling_session_id)
            )
