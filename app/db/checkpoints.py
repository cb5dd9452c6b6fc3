"""Checkpoint rows: which checkpoints exist, where their files are, when they expire, whether they are public.

A checkpoint exists exactly while its row does and has not expired. Files are written before the row (so
a visible checkpoint is complete on any storage) and removed after it (so a deleted one vanishes at once).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sqlalchemy import ColumnElement, Row, and_, delete, func, insert, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.owners import session_ids_of
from app.db.schema import checkpoints, training_runs
from app.errors import NotFound, UserError
from app.storage.paths import CheckpointPath

_CHECKPOINT_TYPES = {"weights": "training", "sampler_weights": "sampler", "external_weights": "external"}
KIND_OF_TYPE = {checkpoint_type: kind for kind, checkpoint_type in _CHECKPOINT_TYPES.items()}  # the SDK's type -> kind


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat()


@dataclass(frozen=True)
class CheckpointRecord:
    path: CheckpointPath
    location: str
    size_bytes: int
    created_at: float
    expires_at: float | None = None
    public: bool = False
    user_metadata: dict[str, str] = field(default_factory=dict)

    def to_json(self, base_model: str | None) -> dict:
        """The REST `Checkpoint` view; `base_model` is its run's (SDK 0.39's `Checkpoint.base_model`)."""
        view = {
            "checkpoint_id": self.path.checkpoint_id,
            "checkpoint_type": _CHECKPOINT_TYPES[self.path.kind],
            "time": _iso(self.created_at),
            "tinker_path": self.path.uri,
            "size_bytes": self.size_bytes,
            "public": self.public,
            "user_metadata": self.user_metadata or None,
            "base_model": base_model,
        }
        if self.expires_at is not None:
            view["expires_at"] = _iso(self.expires_at)
        return view


def already_exists(path: CheckpointPath) -> UserError:
    """The error for a save under a name that a live checkpoint holds (names `path`, the request field)."""
    hint = " (or save_state with overwrite=True)" if path.kind == "weights" else ""
    return UserError(f"checkpoint {path.uri!r} already exists; choose another name{hint}", field="path")


def from_row(row: Row) -> CheckpointRecord:
    return CheckpointRecord(
        CheckpointPath(row.model_id, row.kind, row.name),
        row.location,
        row.size_bytes,
        row.created_at,
        row.expires_at,
        bool(row.public),
        row.user_metadata or {},
    )


def _key(path: CheckpointPath) -> ColumnElement[bool]:
    return and_(
        checkpoints.c.model_id == path.model_id, checkpoints.c.kind == path.kind, checkpoints.c.name == path.name
    )


def live(now: float) -> ColumnElement[bool]:
    return or_(checkpoints.c.expires_at.is_(None), checkpoints.c.expires_at > now)


class CheckpointStore:
    def __init__(self, db: AsyncEngine) -> None:
        self._db = db

    async def find(self, path: CheckpointPath) -> CheckpointRecord | None:
        """The live (unexpired) checkpoint at `path`, if any."""
        async with self._db.connect() as conn:
            row = (await conn.execute(select(checkpoints).where(_key(path), live(time.time())))).first()
        return from_row(row) if row is not None else None

    async def get(self, path: CheckpointPath, *, field: str = "path") -> CheckpointRecord:
        record = await self.find(path)
        if record is None:
            raise NotFound(f"{field} {path.uri!r} does not exist (never saved, deleted or expired)", field=field)
        return record

    async def commit(self, record: CheckpointRecord, overwrite: bool) -> str | None:
        """Make a written checkpoint visible. Returns the location it replaced (now garbage) with `overwrite`;
        without it an existing live checkpoint is a user error and `record` stays invisible."""
        async with self._db.begin() as conn:
            old = (await conn.execute(select(checkpoints).where(_key(record.path)))).first()
            if old is not None and not overwrite and (old.expires_at is None or old.expires_at > time.time()):
                raise already_exists(record.path)
            values = {
                "location": record.location,
                "size_bytes": record.size_bytes,
                "created_at": record.created_at,
                "expires_at": record.expires_at,
                "public": int(record.public),
                "user_metadata": record.user_metadata,
            }
            if old is None:
                try:
                    await conn.execute(
                        insert(checkpoints).values(
                            model_id=record.path.model_id, kind=record.path.kind, name=record.path.name, **values
                        )
                    )
                except IntegrityError as exc:
                    raise UserError(f"checkpoint {record.path.uri!r} was saved twice at once", field="path") from exc
                return None
            await conn.execute(update(checkpoints).where(_key(record.path)).values(**values))
            return old.location

    async def delete(self, path: CheckpointPath) -> CheckpointRecord | None:
        """Remove the row (live or expired); returns it, so the caller removes its files. None if absent."""
        async with self._db.begin() as conn:
            row = (await conn.execute(select(checkpoints).where(_key(path)))).first()
            if row is None:
                return None
            result = await conn.execute(delete(checkpoints).where(_key(path), checkpoints.c.location == row.location))
        return from_row(row) if result.rowcount else None

    async def of_run(self, model_id: str) -> list[CheckpointRecord]:
        """The run's live checkpoints, newest first."""
        async with self._db.connect() as conn:
            rows = await conn.execute(
                select(checkpoints)
                .where(checkpoints.c.model_id == model_id, live(time.time()))
                .order_by(checkpoints.c.created_at.desc())
            )
        return [from_row(row) for row in rows]

    async def page(self, limit: int, offset: int, readable_by: str | None = None) -> tuple[list[CheckpointRecord], int]:
        """One page of live checkpoints, newest first, and the total count: those `readable_by` may read (of the
        sessions they see, and every published one), or every one (None)."""
        now = time.time()
        scope = [live(now)]
        if readable_by is not None:
            runs = select(training_runs.c.model_id).where(training_runs.c.session_id.in_(session_ids_of(readable_by)))
            scope.append(or_(checkpoints.c.public == 1, checkpoints.c.model_id.in_(runs)))
        async with self._db.connect() as conn:
            total = (await conn.execute(select(func.count()).select_from(checkpoints).where(*scope))).scalar_one()
            rows = await conn.execute(
                select(checkpoints)
                .where(*scope)
                .order_by(
                    checkpoints.c.created_at.desc(), checkpoints.c.model_id, checkpoints.c.kind, checkpoints.c.name
                )
                .limit(limit)
                .offset(offset)
            )
        return [from_row(row) for row in rows], int(total)

    async def base_models(self, model_ids: Iterable[str]) -> dict[str, str]:
        """The base model of each of these runs (one whose row is gone is left out)."""
        async with self._db.connect() as conn:
            rows = await conn.execute(
                select(training_runs.c.model_id, training_runs.c.base_model).where(
                    training_runs.c.model_id.in_(set(model_ids))
                )
            )
        return {row.model_id: row.base_model for row in rows}

    async def update(self, path: CheckpointPath, **values: object) -> None:
        """Set `expires_at` and/or `public` of a live checkpoint; NotFound naming `checkpoint_id` otherwise."""
        async with self._db.begin() as conn:
            result = await conn.execute(update(checkpoints).where(_key(path), live(time.time())).values(**values))
        if not result.rowcount:
            raise NotFound(
                f"checkpoint {path.checkpoint_id!r} of {path.model_id!r} does not exist", field="checkpoint_id"
            )

    async def expired(self, now: float, limit: int = 100) -> list[CheckpointPath]:
        """Checkpoints past their expiry, oldest expiry first."""
        async with self._db.connect() as conn:
            rows = await conn.execute(
                select(checkpoints.c.model_id, checkpoints.c.kind, checkpoints.c.name)
                .where(checkpoints.c.expires_at <= now)
                .order_by(checkpoints.c.expires_at)
                .limit(limit)
            )
        return [CheckpointPath(row.model_id, row.kind, row.name) for row in rows]
