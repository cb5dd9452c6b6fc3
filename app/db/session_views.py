"""Reading sessions for the REST views: pages, one session with its runs and samplers, search, and projects.

A session's project and display name live in `session_labels` (given at create_session, or set later by
`PUT /sessions/{id}/project`). Search filters what SQL cannot (metadata pairs, statuses) in Python while walking
the sessions newest first, so a page is always `limit` matches or the last one.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Row, Select, and_, func, insert, or_, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.owners import visible_to
from app.db.schema import checkpoints, sampling_sessions, session_labels, sessions, training_runs
from app.errors import NotFound

_SCAN_BATCH = 500
_LIKE_SPECIALS = re.compile(r"[\\%_]")  # escaped in display-name words: they match literally
_CURSOR_EPSILON_S = 1e-6  # cursors carry microsecond datetimes; created_at is a float


@dataclass(frozen=True)
class SessionInfo:
    session_id: str
    created_at: float
    finished_reason: str | None  # None while open; "expired", or the client's reason (success/errored/...)
    tags: list[str] = field(default_factory=list)
    user_metadata: dict[str, Any] = field(default_factory=dict)
    project_id: str | None = None
    display_name: str | None = None


@dataclass(frozen=True)
class SessionQuery:
    """The SDK's SessionSearchRequest, within the sessions `owner` sees (None: every session)."""

    owner: str | None = None
    session_id: str | None = None
    display_name: str | None = None
    project_ids: list[str] | None = None
    user_metadata: dict[str, str] = field(default_factory=dict)
    matches_status: Callable[[SessionInfo], bool] = lambda _: True
    before: tuple[float, str] | None = None  # the cursor: (created_at, session_id) of the previous page's last

    def matches(self, info: SessionInfo) -> bool:
        meta = {k: str(v) for k, v in info.user_metadata.items()}
        return all(meta.get(k) == v for k, v in self.user_metadata.items()) and self.matches_status(info)


def _select() -> Select:
    return select(
        sessions.c.session_id,
        sessions.c.created_at,
        sessions.c.finished_reason,
        sessions.c.tags,
        sessions.c.user_metadata,
        session_labels.c.project_id,
        session_labels.c.display_name,
    ).select_from(sessions.outerjoin(session_labels, sessions.c.session_id == session_labels.c.session_id))


def _info(row: Row) -> SessionInfo:
    return SessionInfo(
        row.session_id,
        row.created_at,
        row.finished_reason,
        list(row.tags or []),
        dict(row.user_metadata or {}),
        row.project_id,
        row.display_name,
    )


def _newest_first(query: Select) -> Select:
    return query.order_by(sessions.c.created_at.desc(), sessions.c.session_id.desc())


def _sql_filters(q: SessionQuery) -> list:
    filters = [] if q.owner is None else [visible_to(q.owner)]
    # each distinct word once: the request bounded their count (limits.max_search_terms)
    words = [_LIKE_SPECIALS.sub(r"\\\g<0>", word) for word in dict.fromkeys((q.display_name or "").split())]
    by_name = [session_labels.c.display_name.ilike(f"%{word}%", escape="\\") for word in words]
    if q.session_id is not None and by_name:
        filters.append(or_(sessions.c.session_id == q.session_id, and_(*by_name)))
    elif q.session_id is not None:
        filters.append(sessions.c.session_id == q.session_id)
    elif by_name:
        filters.extend(by_name)
    if q.project_ids is not None:
        filters.append(session_labels.c.project_id.in_(q.project_ids))
    return filters


class SessionViews:
    def __init__(self, db: AsyncEngine) -> None:
        self._db = db

    async def page(self, limit: int, offset: int, owner: str | None = None) -> tuple[list[str], int]:
        """One page of the ids of the sessions `owner` sees (None: every session), newest first, and the total
        count."""
        scope = [] if owner is None else [visible_to(owner)]
        async with self._db.connect() as conn:
            total = (await conn.execute(select(func.count()).select_from(sessions).where(*scope))).scalar_one()
            query = _newest_first(select(sessions.c.session_id).where(*scope))
            rows = await conn.execute(query.limit(limit).offset(offset))
        return [row.session_id for row in rows], int(total)

    async def get(self, session_id: str) -> SessionInfo:
        async with self._db.connect() as conn:
            row = (await conn.execute(_select().where(sessions.c.session_id == session_id))).first()
        if row is None:
            raise NotFound(f"session {session_id!r} does not exist", field="session_id")
        return _info(row)

    async def members(self, session_id: str) -> tuple[list[str], list[str]]:
        """(the session's training run ids, its sampler ids), oldest first."""
        async with self._db.connect() as conn:
            runs = await conn.execute(
                select(training_runs.c.model_id)
                .where(training_runs.c.session_id == session_id)
                .order_by(training_runs.c.created_at)
            )
            samplers = await conn.execute(
                select(sampling_sessions.c.sampling_session_id)
                .where(sampling_sessions.c.session_id == session_id)
                .order_by(sampling_sessions.c.created_at)
            )
            return [r.model_id for r in runs], [s.sampling_session_id for s in samplers]

    async def search(self, q: SessionQuery, limit: int) -> tuple[list[SessionInfo], bool]:
        """Up to `limit` matching sessions, newest first, after the cursor; and whether more match."""
        found: list[SessionInfo] = []
        before = q.before
        async with self._db.connect() as conn:
            while True:
                query = _newest_first(_select().where(*_sql_filters(q)))
                if before is not None:
                    created, sid = before
                    query = query.where(
                        or_(
                            sessions.c.created_at < created - _CURSOR_EPSILON_S,
                            and_(
                                sessions.c.created_at <= created + _CURSOR_EPSILON_S,
                                sessions.c.session_id < sid,
                            ),
                        )
                    )
                rows = (await conn.execute(query.limit(_SCAN_BATCH))).all()
                for row in rows:
                    info = _info(row)
                    if q.matches(info):
                        if len(found) == limit:
                            return found, True
                        found.append(info)
                if len(rows) < _SCAN_BATCH:
                    return found, False
                before = (rows[-1].created_at, rows[-1].session_id)

    async def checkpoint_totals(self, session_ids: list[str]) -> dict[str, tuple[int, int]]:
        """session id -> (live checkpoints of its runs, their bytes)."""
        async with self._db.connect() as conn:
            rows = await conn.execute(
                select(training_runs.c.session_id, func.count(), func.sum(checkpoints.c.size_bytes))
                .select_from(checkpoints.join(training_runs, checkpoints.c.model_id == training_runs.c.model_id))
                .where(
                    training_runs.c.session_id.in_(session_ids),
                    or_(checkpoints.c.expires_at.is_(None), checkpoints.c.expires_at > time.time()),
                )
                .group_by(training_runs.c.session_id)
            )
            return {row[0]: (int(row[1]), int(row[2] or 0)) for row in rows}

    async def set_project(self, session_id: str, project_id: str) -> None:
        await self.get(session_id)
        async with self._db.begin() as conn:
            moved = await conn.execute(
                update(session_labels).where(session_labels.c.session_id == session_id).values(project_id=project_id)
            )
            if not moved.rowcount:
                await conn.execute(insert(session_labels).values(session_id=session_id, project_id=project_id))
