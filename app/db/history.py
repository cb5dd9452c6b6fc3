"""Each model's training history: one row per forward_backward, forward and optim_step as it finished, with the
metrics it returned; kept after the model is unloaded, bounded per run (the oldest rows go), paged by seq_id."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.db.group_commit import group_commit
from app.db.schema import run_history


@dataclass(frozen=True)
class HistoryPoint:
    seq_id: int
    kind: str
    at: float
    step: int
    tokens: int
    learning_rate: float | None
    metrics: dict[str, float]

    def to_json(self) -> dict[str, Any]:
        return {
            "seq_id": self.seq_id,
            "kind": self.kind,
            "time": self.at,
            "step": self.step,
            "tokens": self.tokens,
            "learning_rate": self.learning_rate,
            "metrics": self.metrics,
        }


class HistoryStore:
    def __init__(self, db: AsyncEngine, max_points_per_run: int) -> None:
        self._db = db
        self._writes = group_commit(db)
        self._max_points = max_points_per_run

    async def add(self, model_id: str, point: HistoryPoint) -> None:
        """Record a finished operation (a rerun after a restart is recorded already), dropping the run's oldest
        points beyond the bound. It commits with this process's other writes of the moment (app.db.group_commit):
        the trainer completes the operation's future alongside, in the same transaction."""

        async def write(conn: AsyncConnection) -> None:
            await conn.execute(insert(run_history).values(model_id=model_id, **_row(point)))
            if point.seq_id % 64 == 0:  # trimming is one query every 64 operations
                await self._trim(conn, model_id)

        with contextlib.suppress(IntegrityError):
            await self._writes.run(write)

    async def _trim(self, conn: AsyncConnection, model_id: str) -> None:
        newest = (
            select(run_history.c.seq_id)
            .where(run_history.c.model_id == model_id)
            .order_by(run_history.c.seq_id.desc())
            .offset(self._max_points)
            .limit(1)
        )
        oldest_kept = await conn.scalar(newest)
        if oldest_kept is not None:
            await conn.execute(
                delete(run_history).where(run_history.c.model_id == model_id, run_history.c.seq_id <= oldest_kept)
            )

    async def steps_done(self, model_id: str) -> int:
        """How many optim_steps of the model have finished (what a rebuilt trainer counts on from)."""
        async with self._db.connect() as conn:
            steps = await conn.scalar(select(func.max(run_history.c.step)).where(run_history.c.model_id == model_id))
        return int(steps or 0)

    async def page(self, model_id: str, after_seq: int, limit: int) -> list[HistoryPoint]:
        """Up to `limit` points with seq_id > `after_seq`, oldest first."""
        query = (
            select(run_history)
            .where(run_history.c.model_id == model_id, run_history.c.seq_id > after_seq)
            .order_by(run_history.c.seq_id)
            .limit(limit)
        )
        async with self._db.connect() as conn:
            rows = (await conn.execute(query)).all()
        return [HistoryPoint(r.seq_id, r.kind, r.at, r.step, r.tokens, r.learning_rate, dict(r.metrics)) for r in rows]


def _row(point: HistoryPoint) -> dict[str, Any]:
    return {
        "seq_id": point.seq_id,
        "kind": point.kind,
        "at": point.at,
        "step": point.step,
        "tokens": point.tokens,
        "learning_rate": point.learning_rate,
        "metrics": point.metrics,
    }
