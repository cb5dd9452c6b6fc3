"""Stability records: what a sampler saw when it sampled a sequence with `record_stability_info`, kept for the
stable_reinforce loss (the prompt, the sampled tokens, their sampler logprobs, and the weights that sampled them).

Records live in the metadata database, so every replica reads them and restarts keep them. They belong to the
session that sampled them and expire once unused for `retention.stability_record_ttl_seconds`. A record costs
8 bytes per sampled token (int32 token + float32 logprob) plus 4 per prompt token; a user's records together are
bounded by quotas.max_stability_record_bytes_per_user (app.api.user_caps).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from sqlalchemy import Row, delete, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.schema import sessions, stability_records

_IDS_PER_QUERY = 4096  # a query's bound parameters stay under SQLite's (32766) and PostgreSQL's (32767) limits


def sequence_ids(request_id: str, num_samples: int) -> list[str]:
    """`SampledSequence.sequence_id` of each sequence of the sample `request_id` (returned with its future)."""
    return [f"{request_id}:{i}" for i in range(num_samples)]


@dataclass(frozen=True)
class StabilityRecord:
    sequence_id: str
    session_id: str
    adapter_location: str | None  # None: the base model sampled it
    prompt: np.ndarray  # int32
    tokens: np.ndarray  # int32
    logprobs: np.ndarray  # float32, one per sampled token

    @property
    def size_bytes(self) -> int:
        return self.prompt.nbytes + self.tokens.nbytes + self.logprobs.nbytes


def _from_row(row: Row) -> StabilityRecord:
    return StabilityRecord(
        sequence_id=row.sequence_id,
        session_id=row.session_id,
        adapter_location=row.adapter_location,
        prompt=np.frombuffer(row.prompt, dtype=np.int32),
        tokens=np.frombuffer(row.tokens, dtype=np.int32),
        logprobs=np.frombuffer(row.logprobs, dtype=np.float32),
    )


class StabilityStore:
    def __init__(self, db: AsyncEngine) -> None:
        self._db = db

    async def add(self, records: Iterable[StabilityRecord]) -> None:
        """Store `records`, replacing any of the same sequence ids (a sample retried after its sampler died)."""
        now = time.time()
        rows = [
            {
                "sequence_id": r.sequence_id,
                "session_id": r.session_id,
                "adapter_location": r.adapter_location,
                "prompt": r.prompt.astype("<i4").tobytes(),
                "tokens": r.tokens.astype("<i4").tobytes(),
                "logprobs": r.logprobs.astype("<f4").tobytes(),
                "created_at": now,
                "last_used_at": now,
            }
            for r in records
        ]
        if rows:
            async with self._db.begin() as conn:
                ids = [row["sequence_id"] for row in rows]
                await conn.execute(delete(stability_records).where(stability_records.c.sequence_id.in_(ids)))
                await conn.execute(insert(stability_records), rows)

    async def get(self, session_id: str, sequence_ids: Iterable[str], max_ids: int) -> dict[str, StabilityRecord]:
        """The session's live records among `sequence_ids` (another session's are absent); reading keeps them.
        At most `max_ids` ids (limits.max_distinct_sequence_ids_per_request), read in two statements per
        _IDS_PER_QUERY of them: more is a ValueError before any statement (the codec refuses them first)."""
        wanted, found = sorted(set(sequence_ids)), dict[str, StabilityRecord]()
        if len(wanted) > max_ids:
            raise ValueError(f"{len(wanted)} sequence ids asked for at once, over {max_ids}")
        async with self._db.begin() as conn:
            for start in range(0, len(wanted), _IDS_PER_QUERY):
                batch = wanted[start : start + _IDS_PER_QUERY]
                where = (stability_records.c.session_id == session_id) & stability_records.c.sequence_id.in_(batch)
                rows = (await conn.execute(select(stability_records).where(where))).all()
                await conn.execute(update(stability_records).where(where).values(last_used_at=time.time()))
                found.update({row.sequence_id: _from_row(row) for row in rows})
        return found

    async def count(self, session_id: str) -> int:
        async with self._db.connect() as conn:
            query = select(func.count()).where(stability_records.c.session_id == session_id)
            return (await conn.execute(query)).scalar_one()

    async def bytes_of(self, user: str) -> int:
        """What `user`'s own sessions' live records hold, in bytes (their quota)."""
        held = (
            func.length(stability_records.c.prompt)
            + func.length(stability_records.c.tokens)
            + func.length(stability_records.c.logprobs)
        )
        own = select(sessions.c.session_id).where(sessions.c.owner == user)
        query = select(func.coalesce(func.sum(held), 0)).where(stability_records.c.session_id.in_(own))
        async with self._db.connect() as conn:
            return int((await conn.execute(query)).scalar_one())

    async def expire(self, unused_since: float) -> int:
        """Delete every record unused since `unused_since`; returns how many."""
        async with self._db.begin() as conn:
            result = await conn.execute(
                delete(stability_records).where(stability_records.c.last_used_at < unused_since)
            )
        return result.rowcount or 0
