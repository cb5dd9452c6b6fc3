"""The audit log: who did what to which object, when. A user reads the events they did and those about their objects
(another user reading a checkpoint they published, the console revoking their key); admins read all. Rows are only
appended, and removed after retention.audit_retention_days (`expire`)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, insert, or_, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.schema import audit_events

CONSOLE = "console"  # the actor of the operator's console (tinker-serve keys ...)


@dataclass(frozen=True)
class AuditEvent:
    at: float
    event: str
    actor: str
    subject_owner: str | None
    details: dict[str, Any]


class AuditLog:
    def __init__(self, db: AsyncEngine) -> None:
        self._db = db

    async def record(self, event: str, actor: str, details: dict[str, Any], subject_owner: str | None = None) -> None:
        """Append one event (`subject_owner`: whose object it concerns, when that is not the actor)."""
        async with self._db.begin() as conn:
            await conn.execute(
                insert(audit_events).values(
                    at=time.time(),
                    event=event,
                    actor=actor,
                    subject_owner=subject_owner if subject_owner != actor else None,
                    details=details,
                )
            )

    async def read(
        self, start: float, end: float, reader: str | None, prefix: str = "", limit: int | None = None, offset: int = 0
    ) -> list[AuditEvent]:
        """Events in [start, end) whose name starts with `prefix`, oldest first, `limit` of them (None: all) after
        the first `offset`: those `reader` did or that concern their objects (None: every event, for admins)."""
        query = select(audit_events).where(audit_events.c.at >= start, audit_events.c.at < end)
        if prefix:
            query = query.where(audit_events.c.event.startswith(prefix, autoescape=True))
        if reader is not None:
            query = query.where(or_(audit_events.c.actor == reader, audit_events.c.subject_owner == reader))
        async with self._db.connect() as conn:
            query = query.order_by(audit_events.c.at, audit_events.c.event_id).limit(limit).offset(offset)
            rows = await conn.execute(query)
            return [AuditEvent(r.at, r.event, r.actor, r.subject_owner, dict(r.details)) for r in rows]

    async def expire(self, before: float) -> int:
        """Remove the events recorded before `before`; returns how many."""
        async with self._db.begin() as conn:
            return (await conn.execute(delete(audit_events).where(audit_events.c.at < before))).rowcount
