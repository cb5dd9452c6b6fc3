"""Sessions and training runs: who created which model on which base, with which LoRA config."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Row, Text, cast, func, insert, null, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.owners import session_ids_of
from app.db.schema import sampling_sessions, session_labels, sessions, training_runs
from app.errors import NotFound, UserError


@dataclass(frozen=True)
class TrainingRun:
    model_id: str
    session_id: str
    base_model: str
    lora_rank: int
    role: str  # "policy" or "critic"
    trainer: str  # the trainer that holds the model (see BaseModelConfig.trainer_for)
    lora_config: dict
    user_metadata: dict
    created_at: float
    unloaded: bool


def _run_from_row(row: Row[Any]) -> TrainingRun:
    return TrainingRun(
        model_id=row.model_id,
        session_id=row.session_id,
        base_model=row.base_model,
        lora_rank=row.lora_rank,
        role=row.role,
        trainer=row.trainer,
        lora_config=row.lora_config,
        user_metadata=row.user_metadata or {},
        created_at=row.created_at,
        unloaded=bool(row.unloaded),
    )


@dataclass(frozen=True)
class Kept:
    """What a user's sessions and runs keep, for their quotas (app.api.user_caps)."""

    sessions: int  # open, or created since the metadata retention cut-off
    runs: int  # live, or created since the cut-off
    metadata_bytes: int  # tags and user_metadata as JSON, of every session and run not pruned


def _json_bytes(column: ColumnElement) -> ColumnElement:
    """A JSON column's stored size (its JSON text, ASCII: characters are bytes); 0 when null (pruned)."""
    return func.coalesce(func.length(cast(column, Text)), 0)


def session_not_found(session_id: str) -> NotFound:
    """What a session that does not exist, or is another user's, answers."""
    return NotFound(f"session {session_id!r} does not exist; create a new ServiceClient", field="session_id")


def model_not_found(model_id: str) -> NotFound:
    """What a model that does not exist, or is another user's, answers."""
    return NotFound(f"model {model_id!r} does not exist", field="model_id")


def model_id_for(session_id: str, model_seq_id: int) -> str:
    """The mandatory Tinker model id format (the SDK builds it itself for create-from-state)."""
    return f"{session_id}:train:{model_seq_id}"


class MetadataStore:
    def __init__(self, db: AsyncEngine) -> None:
        self._db = db

    async def create_session(
        self,
        sdk_version: str | None,
        tags: list[str],
        user_metadata: dict,
        project_id: str | None = None,
        display_name: str | None = None,
        owner: str | None = None,
    ) -> str:
        """A new session of `owner` (the user id; None only for sessions made outside any request)."""
        session_id = uuid.uuid4().hex[:16]
        now = time.time()
        async with self._db.begin() as conn:
            await conn.execute(
                insert(sessions).values(
                    session_id=session_id,
                    created_at=now,
                    last_heartbeat=now,
                    sdk_version=sdk_version,
                    tags=tags,
                    user_metadata=user_metadata,
                    owner=owner,
                )
            )
            if project_id is not None or display_name is not None:
                await conn.execute(
                    insert(session_labels).values(
                        session_id=session_id, project_id=project_id, display_name=display_name
                    )
                )
        return session_id

    async def heartbeat(self, session_id: str) -> bool:
        """Record a heartbeat; False when the session is unknown or finished (expired included)."""
        async with self._db.begin() as conn:
            result = await conn.execute(
                update(sessions)
                .where(sessions.c.session_id == session_id, sessions.c.finished_reason.is_(None))
                .values(last_heartbeat=time.time())
            )
        return result.rowcount > 0

    async def expire_sessions(self, silent_since: float) -> list[str]:
        """Finish, as "expired", every open session whose last heartbeat is older than `silent_since`."""
        async with self._db.begin() as conn:
            silent = (sessions.c.finished_reason.is_(None)) & (sessions.c.last_heartbeat < silent_since)
            ids = [row.session_id for row in await conn.execute(select(sessions.c.session_id).where(silent))]
            if ids:
                await conn.execute(
                    update(sessions).where(silent, sessions.c.session_id.in_(ids)).values(finished_reason="expired")
                )
        return ids

    async def loaded_runs_of(self, session_id: str) -> list[TrainingRun]:
        """The session's models that have not been unloaded."""
        async with self._db.connect() as conn:
            rows = await conn.execute(
                select(training_runs).where(training_runs.c.session_id == session_id, training_runs.c.unloaded == 0)
            )
        return [_run_from_row(row) for row in rows]

    async def finish_session(self, session_id: str, reason: str) -> None:
        async with self._db.begin() as conn:
            await conn.execute(
                update(sessions)
                .where(sessions.c.session_id == session_id, sessions.c.finished_reason.is_(None))
                .values(finished_reason=reason)
            )

    async def owner_of(self, session_id: str) -> str | None:
        """The session's owner (None: made before owners were recorded); NotFound when there is no session."""
        async with self._db.connect() as conn:
            row = (await conn.execute(select(sessions.c.owner).where(sessions.c.session_id == session_id))).first()
        if row is None:
            raise session_not_found(session_id)
        return row.owner

    async def add_training_run(self, run: TrainingRun, *, exists_ok: bool = False) -> None:
        """Record a new model; `exists_ok`: a model of that id recorded already (a retried create) is no error."""
        try:
            async with self._db.begin() as conn:
                await conn.execute(
                    insert(training_runs).values(
                        model_id=run.model_id,
                        session_id=run.session_id,
                        base_model=run.base_model,
                        lora_rank=run.lora_rank,
                        role=run.role,
                        trainer=run.trainer,
                        lora_config=run.lora_config,
                        user_metadata=run.user_metadata,
                        created_at=run.created_at,
                        unloaded=int(run.unloaded),
                    )
                )
        except IntegrityError as exc:
            if exists_ok:
                return
            raise UserError(
                f"model {run.model_id!r} already exists (model_seq_id reused)", field="model_seq_id"
            ) from exc

    async def get_training_run(self, model_id: str) -> TrainingRun:
        async with self._db.connect() as conn:
            row = (await conn.execute(select(training_runs).where(training_runs.c.model_id == model_id))).first()
        if row is None:
            raise model_not_found(model_id)
        return _run_from_row(row)

    async def list_training_runs(
        self, limit: int, offset: int, owner: str | None = None
    ) -> tuple[list[TrainingRun], int]:
        """One page of runs (of the sessions `owner` sees; None: every run), newest first, and the total count."""
        scope = [] if owner is None else [training_runs.c.session_id.in_(session_ids_of(owner))]
        async with self._db.connect() as conn:
            total = (await conn.execute(select(func.count()).select_from(training_runs).where(*scope))).scalar_one()
            rows = await conn.execute(
                select(training_runs)
                .where(*scope)
                .order_by(training_runs.c.created_at.desc(), training_runs.c.model_id)
                .limit(limit)
                .offset(offset)
            )
        return [_run_from_row(row) for row in rows], int(total)

    async def live_model_ids_on(self, trainer: str) -> list[str]:
        """The models routed to `trainer` and not unloaded."""
        async with self._db.connect() as conn:
            rows = await conn.execute(
                select(training_runs.c.model_id).where(
                    training_runs.c.trainer == trainer, training_runs.c.unloaded == 0
                )
            )
        return [row.model_id for row in rows]

    async def mark_unloaded(self, model_id: str) -> None:
        async with self._db.begin() as conn:
            await conn.execute(update(training_runs).where(training_runs.c.model_id == model_id).values(unloaded=1))

    async def kept_by(self, user: str, kept_since: float, besides: str | None = None) -> Kept:
        """What `user`'s own sessions and runs keep: open sessions and live runs, and those created since
        `kept_since`; `besides`: a model being created again by a retry, not counted."""
        own = select(sessions.c.session_id).where(sessions.c.owner == user)
        runs: ColumnElement[bool] = training_runs.c.session_id.in_(own)
        if besides is not None:
            runs = runs & (training_runs.c.model_id != besides)
        kept_sessions = (sessions.c.finished_reason.is_(None)) | (sessions.c.created_at >= kept_since)
        kept_runs = (training_runs.c.unloaded == 0) | (training_runs.c.created_at >= kept_since)
        session_query = select(
            func.count().filter(kept_sessions),
            func.coalesce(func.sum(_json_bytes(sessions.c.tags) + _json_bytes(sessions.c.user_metadata)), 0),
        ).where(sessions.c.owner == user)
        run_query = select(
            func.count().filter(kept_runs), func.coalesce(func.sum(_json_bytes(training_runs.c.user_metadata)), 0)
        ).where(runs)
        async with self._db.connect() as conn:
            session_count, session_bytes = (await conn.execute(session_query)).one()
            run_count, run_bytes = (await conn.execute(run_query)).one()
        return Kept(int(session_count), int(run_count), int(session_bytes) + int(run_bytes))

    async def ephemeral_samplers_of(self, user: str, besides: str) -> int:
        """`user`'s live ephemeral samplers, not counting `besides` (one being saved again by a retry)."""
        own = select(sessions.c.session_id).where(sessions.c.owner == user)
        query = select(func.count()).where(
            sampling_sessions.c.session_id.in_(own),
            sampling_sessions.c.ephemeral == 1,
            sampling_sessions.c.sampling_session_id != besides,
        )
        async with self._db.connect() as conn:
            return int((await conn.execute(query)).scalar_one())

    async def prune_metadata(self, created_before: float) -> int:
        """Remove the tags and user_metadata of finished sessions and unloaded runs created before
        `created_before` (their rows stay: checkpoints and history belong to them); returns how many rows."""
        kept = (sessions.c.tags.is_not(None)) | (sessions.c.user_metadata.is_not(None))
        async with self._db.begin() as conn:
            pruned_sessions = await conn.execute(
                update(sessions)
                .where(sessions.c.finished_reason.is_not(None), sessions.c.created_at < created_before, kept)
                .values(tags=null(), user_metadata=null())
            )
            pruned_runs = await conn.execute(
                update(training_runs)
                .where(
                    training_runs.c.unloaded == 1,
                    training_runs.c.created_at < created_before,
                    training_runs.c.user_metadata.is_not(None),
                )
                .values(user_metadata=null())
            )
        return (pruned_sessions.rowcount or 0) + (pruned_runs.rowcount or 0)
