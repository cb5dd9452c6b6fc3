"""Searching checkpoints (the SDK's search_checkpoints): owner, project, type and base-model filters in SQL, newest
first, paged by (created_at, tinker path). Each user_metadata pair narrows the rows in SQL to those whose JSON text
holds it as stored (`"key": "value"`, json.dumps' form on both backends), and is matched exactly in Python while
walking them, so a page is always `limit` matches or the last one.

Whose checkpoints: the reader's own (of the sessions they see, app.db.owners), every published one, or the published
ones of named users (and all of the reader's own when they name themselves). Another user's unpublished checkpoint
is never a row here.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Literal

from sqlalchemy import ColumnElement, Row, Select, Text, and_, cast, or_, select, tuple_
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.checkpoints import CheckpointRecord, from_row, live
from app.db.owners import session_ids_of
from app.db.schema import checkpoints, session_labels, sessions, training_runs
from app.storage.paths import CheckpointPath

_LIKE_SPECIALS = re.compile(r"[\\%_]")  # escaped in a metadata pair's pattern: they match literally
_CURSOR_EPSILON_S = 1e-6  # cursors carry microsecond datetimes; created_at is a float


@dataclass(frozen=True)
class FoundCheckpoint:
    record: CheckpointRecord
    base_model: str | None  # its run's (None: the run's row is gone)

    def to_json(self) -> dict:
        return self.record.to_json(self.base_model)


@dataclass(frozen=True)
class CheckpointQuery:
    """The SDK's CheckpointSearchRequest, as `reader` may see it."""

    reader: str
    owners: Literal["own", "accessible"] | tuple[str, ...] = "own"  # or the user ids named
    project_ids: list[str] | None = None
    user_metadata: dict[str, str] = field(default_factory=dict)
    kind: str | None = None  # weights | sampler_weights | external_weights; None: every kind
    base_models: list[str] | None = None
    before: tuple[float, CheckpointPath] | None = None  # the cursor: the previous page's last (created_at, path)

    def matches(self, record: CheckpointRecord) -> bool:
        return all(record.user_metadata.get(k) == v for k, v in self.user_metadata.items())


def _whose(q: CheckpointQuery) -> ColumnElement[bool]:
    own = training_runs.c.session_id.in_(session_ids_of(q.reader))
    published = checkpoints.c.public == 1
    if q.owners == "own":
        return own
    if q.owners == "accessible":
        return or_(own, published)
    theirs = select(sessions.c.session_id).where(sessions.c.owner.in_([u for u in q.owners if u != q.reader]))
    named = and_(published, training_runs.c.session_id.in_(theirs))
    return or_(named, own) if q.reader in q.owners else named


def _filters(q: CheckpointQuery, now: float) -> list[ColumnElement[bool]]:
    filters = [live(now), _whose(q)]
    if q.kind is not None:
        filters.append(checkpoints.c.kind == q.kind)
    if q.base_models is not None:
        filters.append(training_runs.c.base_model.in_(q.base_models))
    for key, value in q.user_metadata.items():
        pair = _LIKE_SPECIALS.sub(r"\\\g<0>", f"{json.dumps(key)}: {json.dumps(value)}")
        filters.append(cast(checkpoints.c.user_metadata, Text).like(f"%{pair}%", escape="\\"))
    if q.project_ids is not None:
        labelled = select(session_labels.c.session_id).where(session_labels.c.project_id.in_(q.project_ids))
        filters.append(training_runs.c.session_id.in_(labelled))
    return filters


def _after(before: tuple[float, CheckpointPath]) -> ColumnElement[bool]:
    """Rows after the cursor in the order newest first, then by path, descending."""
    created, path = before
    key = tuple_(checkpoints.c.model_id, checkpoints.c.kind, checkpoints.c.name)
    earlier = key < tuple_(path.model_id, path.kind, path.name)
    return or_(
        checkpoints.c.created_at < created - _CURSOR_EPSILON_S,
        and_(checkpoints.c.created_at <= created + _CURSOR_EPSILON_S, earlier),
    )


def _select(q: CheckpointQuery, before: tuple[float, CheckpointPath] | None, now: float) -> Select:
    joined = checkpoints.outerjoin(training_runs, checkpoints.c.model_id == training_runs.c.model_id)
    query = select(checkpoints, training_runs.c.base_model).select_from(joined).where(*_filters(q, now))
    if before is not None:
        query = query.where(_after(before))
    return query.order_by(
        checkpoints.c.created_at.desc(),
        checkpoints.c.model_id.desc(),
        checkpoints.c.kind.desc(),
        checkpoints.c.name.desc(),
    )


def _position(row: Row) -> tuple[float, CheckpointPath]:
    return row.created_at, CheckpointPath(row.model_id, row.kind, row.name)


class CheckpointSearch:
    def __init__(self, db: AsyncEngine) -> None:
        self._db = db

    async def search(self, q: CheckpointQuery, limit: int) -> tuple[list[FoundCheckpoint], bool]:
        """Up to `limit` matching live checkpoints, newest first, after the cursor; and whether more match."""
        found: list[FoundCheckpoint] = []
        before, now = q.before, time.time()
        async with self._db.connect() as conn:
            while True:
                rows = (await conn.execute(_select(q, before, now).limit(limit + 1))).all()
                for row in rows:
                    record = from_row(row)
                    if q.matches(record):
                        if len(found) == limit:
                            return found, True
                        found.append(FoundCheckpoint(record, row.base_model))
                if len(rows) <= limit:  # the last rows after the cursor
                    return found, False
                before = _position(rows[-1])  # some matched only in SQL (SQLite's LIKE ignores case): walk on
