"""Session traces: a session's requests (every future its models and samplers created) with their timings.

`FutureStore.create` files each future under its session in `session_requests`; the timings and outcomes are
the futures' own (`created_at`, `completed_at`, `state`). A sweep keeps each session's newest
`retention.max_trace_events_per_session` entries.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import delete, func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.schema import futures, session_requests


@dataclass(frozen=True)
class RequestEvent:
    request_id: str
    kind: str  # forward_backward, optim_step, sample, save_weights, ...
    model_id: str  # the training run or the sampling session
    seq_id: int | None
    state: str  # pending | completed | failed
    created_at: float
    completed_at: float | None


class TraceStore:
    def __init__(self, db: AsyncEngine) -> None:
        self._db = db

    async def events(self, session_id: str, limit: int) -> list[RequestEvent]:
        """The session's newest `limit` requests, oldest first."""
        async with self._db.connect() as conn:
            rows = await conn.execute(
                select(
                    futures.c.request_id,
                    futures.c.kind,
                    futures.c.subject_id.label("model_id"),
                    futures.c.seq_id,
                    futures.c.state,
                    futures.c.created_at,
                    futures.c.completed_at,
                )
                .select_from(session_requests.join(futures, session_requests.c.request_id == futures.c.request_id))
                .where(session_requests.c.session_id == session_id)
                .order_by(session_requests.c.created_at.desc(), session_requests.c.request_id)
                .limit(limit)
            )
            return [RequestEvent(*row) for row in reversed(rows.all())]

    async def trim(self, keep: int) -> int:
        """Forget all but each session's newest `keep` requests; returns how many were forgotten."""
        forgotten = 0
        async with self._db.begin() as conn:
            crowded = await conn.execute(
                select(session_requests.c.session_id)
                .group_by(session_requests.c.session_id)
                .having(func.count() > keep)
            )
            for session_id in [row.session_id for row in crowded]:
                newest = (
                    select(session_requests.c.request_id)
                    .where(session_requests.c.session_id == session_id)
                    .order_by(session_requests.c.created_at.desc(), session_requests.c.request_id)
                    .limit(keep)
                    .scalar_subquery()
                )
                result = await conn.execute(
                    delete(session_requests).where(
                        session_requests.c.session_id == session_id, session_requests.c.request_id.not_in(newest)
                    )
                )
                forgotten += result.rowcount
        return forgotten
