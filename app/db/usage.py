"""Usage accounting: tokens trained and sampled, counted per UTC hour, session, base model and kind, and the
bytes each run's live checkpoints hold.

Counting points (real tokens, never estimates): a forward or forward_backward counts every datum's model-input
tokens when the ingress accepts it (validated and queued; a rejected request counts nothing); a sample counts
its prompt once (`sampling_prefill`) and every sampled token of every sequence (`sampling_sample`) when the
Sampler completes it. Each count is one upsert into the hour's row, so the table stays small.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from sqlalchemy import func, or_, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.db.group_commit import group_commit
from app.db.owners import session_ids_of
from app.db.schema import checkpoints, session_labels, training_runs, usage_hours

logger = logging.getLogger("tinker_serve.usage")
KINDS = ("training", "sampling_prefill", "sampling_sample")
HOUR_S = 3600


@dataclass(frozen=True)
class UsageRow:
    bucket_start: float
    session_id: str
    base_model: str
    kind: str
    token_count: int


@dataclass(frozen=True)
class RunStorage:
    model_id: str
    session_id: str
    project_id: str | None
    checkpoint_count: int
    size_bytes: int


class UsageStore:
    def __init__(self, db: AsyncEngine) -> None:
        self._db = db
        self._writes = group_commit(db)  # counts share a transaction with the futures that finish with them

    async def add(self, session_id: str, base_model: str, counts: dict[str, int], at: float | None = None) -> None:
        """Add `counts` (kind -> tokens) to the session's row of the hour holding `at` (default now)."""
        counts = {kind: n for kind, n in counts.items() if n > 0}
        if not counts:
            return
        if any(kind not in KINDS for kind in counts):
            raise ValueError(f"usage kinds are {KINDS}, got {sorted(counts)}")
        bucket = float(int((time.time() if at is None else at) // HOUR_S) * HOUR_S)
        dialect = postgresql if self._db.dialect.name == "postgresql" else sqlite

        async def write(conn: AsyncConnection) -> None:
            for kind, tokens in sorted(counts.items()):
                statement = dialect.insert(usage_hours).values(
                    bucket_start=bucket, session_id=session_id, base_model=base_model, kind=kind, token_count=tokens
                )
                await conn.execute(
                    statement.on_conflict_do_update(
                        index_elements=["bucket_start", "session_id", "base_model", "kind"],
                        set_={"token_count": usage_hours.c.token_count + statement.excluded.token_count},
                    )
                )

        await self._writes.run(write)

    async def record(self, session_id: str, base_model: str, counts: dict[str, int]) -> None:
        """`add` for the request paths: a failure to count is logged, never the request's failure."""
        try:
            await self.add(session_id, base_model, counts)
        except Exception:
            logger.exception("counting %s tokens of session %s failed", counts, session_id)

    async def hours(self, start: float, end: float, owner: str | None = None) -> list[UsageRow]:
        """Rows of the hours in [start, end) (of the sessions `owner` sees; None: every session), ordered by hour
        then descending token count."""
        scope = [] if owner is None else [usage_hours.c.session_id.in_(session_ids_of(owner))]
        async with self._db.connect() as conn:
            rows = await conn.execute(
                select(usage_hours)
                .where(usage_hours.c.bucket_start >= start, usage_hours.c.bucket_start < end, *scope)
                .order_by(usage_hours.c.bucket_start, usage_hours.c.token_count.desc(), usage_hours.c.session_id)
            )
            return [UsageRow(r.bucket_start, r.session_id, r.base_model, r.kind, int(r.token_count)) for r in rows]

    async def checkpoint_storage(self, project_id: str | None = None, owner: str | None = None) -> list[RunStorage]:
        """Per run with live checkpoints (of sessions in `project_id`, if given, and that `owner` sees, if given):
        their count and bytes, largest first."""
        size = func.sum(checkpoints.c.size_bytes)
        runs = checkpoints.join(training_runs, checkpoints.c.model_id == training_runs.c.model_id).outerjoin(
            session_labels, training_runs.c.session_id == session_labels.c.session_id
        )
        live = or_(checkpoints.c.expires_at.is_(None), checkpoints.c.expires_at > time.time())
        keys = (training_runs.c.model_id, training_runs.c.session_id, session_labels.c.project_id)
        query = (
            select(*keys, func.count(), size)
            .select_from(runs)
            .where(live)
            .group_by(*keys)
            .order_by(size.desc(), training_runs.c.model_id)
        )
        if project_id is not None:
            query = query.where(session_labels.c.project_id == project_id)
        if owner is not None:
            query = query.where(training_runs.c.session_id.in_(session_ids_of(owner)))
        async with self._db.connect() as conn:
            rows = await conn.execute(query)
            return [RunStorage(r[0], r[1], r[2], int(r[3]), int(r[4] or 0)) for r in rows]
