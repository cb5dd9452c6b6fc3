"""What a user holds, for their quotas: live models, live checkpoint bytes, training operations still pending (and
their bytes). Only
the user's own sessions count (not those made before owners were recorded)."""

from __future__ import annotations

import time

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.owners import owned_runs
from app.db.schema import checkpoints, external_uploads, futures, journal, training_runs


class QuotaStore:
    def __init__(self, db: AsyncEngine) -> None:
        self._db = db

    async def live_models(self, user: str, besides: str | None = None) -> int:
        """The user's models not unloaded (not counting `besides`, a model being created again by a retry)."""
        query = select(func.count()).where(
            training_runs.c.model_id.in_(owned_runs(user)), training_runs.c.unloaded == 0
        )
        if besides is not None:
            query = query.where(training_runs.c.model_id != besides)
        async with self._db.connect() as conn:
            return int((await conn.execute(query)).scalar_one())

    async def checkpoint_bytes(self, user: str) -> int:
        """The bytes of the user's live checkpoints and those their unfinished uploads hold (app.api.uploads)."""
        live = (checkpoints.c.expires_at.is_(None)) | (checkpoints.c.expires_at > time.time())
        query = select(func.coalesce(func.sum(checkpoints.c.size_bytes), 0)).where(
            checkpoints.c.model_id.in_(owned_runs(user)), live
        )
        uploading = select(func.coalesce(func.sum(external_uploads.c.reserved_bytes), 0)).where(
            external_uploads.c.owner == user,
            external_uploads.c.tinker_path.is_(None),
            external_uploads.c.expires_at > time.time(),
        )
        async with self._db.connect() as conn:
            return int((await conn.execute(query)).scalar_one()) + int((await conn.execute(uploading)).scalar_one())

    async def awaited_seq(self, model_id: str) -> int | None:
        """The seq_id the model's pending operations wait for and nobody sent yet: the first one without a future
        after the last that completed before them (the trainer runs a model's operations in seq_id order). None when
        none is awaited: nothing pending, or the first pending one is next."""
        of_model = futures.c.subject_id == model_id
        later = futures.alias("later")
        async with self._db.connect() as conn:
            first = await conn.scalar(select(func.min(futures.c.seq_id)).where(of_model, futures.c.state == "pending"))
            if first is None:
                return None
            done = select(func.max(futures.c.seq_id)).where(
                of_model, futures.c.state == "completed", futures.c.seq_id < first
            )
            follows = (later.c.subject_id == model_id) & (later.c.seq_id == futures.c.seq_id + 1)
            gap = select(func.min(futures.c.seq_id + 1)).where(
                of_model,
                futures.c.seq_id >= done.scalar_subquery(),
                futures.c.seq_id + 1 < first,
                ~select(later.c.seq_id).where(follows).exists(),
            )
            awaited = await conn.scalar(gap)
        return None if awaited is None else int(awaited)

    async def pending(self, user: str) -> tuple[int, int]:
        """The user's training operations whose futures are still pending, and the bytes their journal rows hold
        (a forward_backward's batch: what the ingress and the trainer hold until it runs)."""
        held = func.coalesce(func.sum(func.length(journal.c.op)), 0)
        on_journal = (journal.c.model_id == futures.c.subject_id) & (journal.c.seq_id == futures.c.seq_id)
        query = (
            select(func.count(), held)
            .select_from(futures.outerjoin(journal, on_journal))
            .where(futures.c.subject_id.in_(owned_runs(user)), futures.c.state == "pending")
        )
        async with self._db.connect() as conn:
            count, nbytes = (await conn.execute(query)).one()
        return int(count), int(nbytes)
