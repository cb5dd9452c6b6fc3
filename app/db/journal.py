"""What rebuilds a model that lived only in a worker's memory: the journal of its accepted operations and its
latest snapshots.

The ingress appends each operation before the trainer sees it. A snapshot (adapter + optimizer state, written by
rank 0 while training goes on) covers every operation up to its seq_id; a new one is recorded when the workers
have copied the tensors, and its predecessor is then complete on storage (ranks write one snapshot at a time).
So the two newest are kept: the newest may be unfinished if a worker died while writing it, the one before it is
whole, and the journal keeps what follows that one (plus the creation, seq_id 0, which says how to make the model).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection
from dataclasses import dataclass

from sqlalchemy import and_, delete, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import journal_codec
from app.db.group_commit import group_commit
from app.db.schema import futures, journal, snapshots
from app.messages import PassLayout, SequencedOp

KEPT_SNAPSHOTS = 2


@dataclass(frozen=True)
class JournalEntry:
    seq_id: int
    request_id: str
    op: SequencedOp
    state: str  # its future's: pending | completed | failed
    worker_deaths: int = 0  # how often the training workers died while it ran
    layout: PassLayout | None = None  # the mixed pass it ran in, if it ran in one (what replays it)


@dataclass(frozen=True)
class Snapshot:
    seq_id: int
    location: str
    created_at: float


class JournalStore:
    def __init__(self, db: AsyncEngine) -> None:
        self._db = db
        self._writes = group_commit(db)

    async def append(self, model_id: str, seq_id: int, op: SequencedOp, encoded: bytes | None = None) -> bool:
        """Record an accepted operation (`encoded`: its journal_codec encoding, when the caller made it); False when
        (model_id, seq_id) is recorded already (a retry)."""
        row = {
            "model_id": model_id,
            "seq_id": seq_id,
            "request_id": op.request_id,
            "op": journal_codec.encode(op) if encoded is None else encoded,
            "created_at": time.time(),
        }
        try:  # shares a commit with the process's other writes of the moment
            await self._writes.run(lambda conn: conn.execute(insert(journal).values(**row)))
        except IntegrityError:
            return False
        return True

    async def entries(self, model_id: str) -> list[JournalEntry]:
        """The model's journal in seq_id order, each with its future's state."""
        query = (
            select(
                journal.c.seq_id,
                journal.c.request_id,
                journal.c.op,
                journal.c.worker_deaths,
                journal.c.layout,
                futures.c.state,
            )
            .join(futures, futures.c.request_id == journal.c.request_id, isouter=True)
            .where(journal.c.model_id == model_id)
            .order_by(journal.c.seq_id)
        )
        async with self._db.connect() as conn:
            rows = (await conn.execute(query)).all()
        return [
            JournalEntry(
                r.seq_id,
                r.request_id,
                journal_codec.decode(r.op),
                r.state or "failed",
                r.worker_deaths,
                None if r.layout is None else journal_codec.decode_tree(r.layout),
            )
            for r in rows
        ]

    async def pending_since(self, before: float) -> list[tuple[str, int]]:
        """(model_id, seq_id) of the journaled operations whose futures, made before `before`, are still pending,
        creations left out, in model and seq_id order: their ids only (`ops` reads the ones needed)."""
        on_journal = (journal.c.model_id == futures.c.subject_id) & (journal.c.seq_id == futures.c.seq_id)
        query = (  # futures and the journal's key only: no journal row is read (an op may be a large batch)
            select(journal.c.model_id, journal.c.seq_id)
            .join(futures, on_journal)
            .where(futures.c.state == "pending", journal.c.seq_id > 0, futures.c.created_at < before)
            .order_by(journal.c.model_id, journal.c.seq_id)
        )
        async with self._db.connect() as conn:
            return [(r.model_id, r.seq_id) for r in await conn.execute(query)]

    async def ops(self, model_id: str, seq_ids: Collection[int]) -> dict[int, SequencedOp]:
        """The model's journaled operations of these seq_ids (creations left out), decoded off the event loop."""
        query = select(journal.c.seq_id, journal.c.op).where(
            journal.c.model_id == model_id, journal.c.seq_id > 0, journal.c.seq_id.in_(seq_ids)
        )
        async with self._db.connect() as conn:
            rows = (await conn.execute(query)).all()
        decoded = await asyncio.to_thread(lambda: [(r.seq_id, journal_codec.decode(r.op)) for r in rows])
        return {seq_id: op for seq_id, op in decoded if isinstance(op, SequencedOp)}

    async def record_layout(self, model_id: str, seq_id: int, layout: PassLayout) -> None:
        """Record the mixed pass the operation ran in (before its future completes: a rebuild replays it so)."""
        blob = journal_codec.encode_tree(layout)
        statement = update(journal).where(journal.c.model_id == model_id, journal.c.seq_id == seq_id)
        await self._writes.run(lambda conn: conn.execute(statement.values(layout=blob)))

    async def charge_worker_death(self, request_ids: Collection[str]) -> dict[str, int]:
        """Count a death of the training workers against each of these operations (they were running); returns how
        many each has been charged so far (an operation no longer journaled is left out)."""
        if not request_ids:
            return {}
        async with self._db.begin() as conn:
            await conn.execute(
                update(journal)
                .where(journal.c.request_id.in_(request_ids))
                .values(worker_deaths=journal.c.worker_deaths + 1)
            )
            query = select(journal.c.request_id, journal.c.worker_deaths).where(journal.c.request_id.in_(request_ids))
            return {r.request_id: r.worker_deaths for r in await conn.execute(query)}

    async def snapshots_of(self, model_id: str) -> list[Snapshot]:
        """The model's snapshots, newest first."""
        query = (
            select(snapshots.c.seq_id, snapshots.c.location, snapshots.c.created_at)
            .where(snapshots.c.model_id == model_id)
            .order_by(snapshots.c.seq_id.desc())
        )
        async with self._db.connect() as conn:
            return [Snapshot(r.seq_id, r.location, r.created_at) for r in await conn.execute(query)]

    async def record_snapshot(self, model_id: str, seq_id: int, location: str) -> list[str]:
        """Record a snapshot taken after `seq_id`; drops snapshots beyond the newest two and the journal the older
        kept one covers. Returns the dropped snapshots' locations (to delete from storage)."""
        async with self._db.begin() as conn:
            await conn.execute(
                insert(snapshots).values(model_id=model_id, seq_id=seq_id, location=location, created_at=time.time())
            )
            kept = (
                await conn.execute(
                    select(snapshots.c.seq_id, snapshots.c.location)
                    .where(snapshots.c.model_id == model_id)
                    .order_by(snapshots.c.seq_id.desc())
                )
            ).all()
            dropped = kept[KEPT_SNAPSHOTS:]
            if dropped:
                await conn.execute(
                    delete(snapshots).where(snapshots.c.model_id == model_id, snapshots.c.seq_id <= dropped[0].seq_id)
                )
            if len(kept) >= KEPT_SNAPSHOTS:
                covered = kept[KEPT_SNAPSHOTS - 1].seq_id
                await conn.execute(
                    delete(journal).where(
                        and_(journal.c.model_id == model_id, journal.c.seq_id > 0, journal.c.seq_id <= covered)
                    )
                )
        return [row.location for row in dropped]

    async def forget(self, model_id: str) -> list[str]:
        """Drop the model's journal and snapshots (it was unloaded); returns the snapshots' locations."""
        async with self._db.begin() as conn:
            locations = [
                row.location
                for row in await conn.execute(select(snapshots.c.location).where(snapshots.c.model_id == model_id))
            ]
            await conn.execute(delete(snapshots).where(snapshots.c.model_id == model_id))
            await conn.execute(delete(journal).where(journal.c.model_id == model_id))
        return locations
