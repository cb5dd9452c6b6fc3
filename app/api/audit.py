"""`GET /audit` (AdminClient.get_audit_log): one UTC day of the audit log (app.db.audit), oldest first, a page at a
time (`limit`, at most 1000; the next page is at `next_offset`, null after the last). A user reads the events they
did and those about their objects; users named in `auth.admin_users` read every event."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Literal

from fastapi import APIRouter, Query

from app.api.deps import OffsetQuery, ServicesDep, UserDep
from app.db.audit import AuditEvent
from app.errors import UserError

router = APIRouter(prefix="/api/v1")
_RESOURCES = {"all": "", "checkpoints": "checkpoint_"}  # projects, teams, organizations: none exist here


def _entry(event: AuditEvent) -> dict:
    details = {"actor": event.actor, **event.details}
    if event.subject_owner is not None:
        details["owner"] = event.subject_owner
    checkpoint = event.event.startswith("checkpoint_")
    return {
        "timestamp": datetime.fromtimestamp(event.at, UTC).isoformat(),
        "event": event.event,
        "event_details": details,
        "model_id": event.details.get("model_id") if checkpoint else None,
        "tinker_path": event.details.get("tinker_path") if checkpoint else None,
        "purpose": event.details.get("purpose"),
    }


@router.get("/audit")
async def audit_log(
    services: ServicesDep,
    user: UserDep,
    event_type: Literal["all", "checkpoints", "projects", "teams", "organizations"] = "all",
    day: date | None = None,
    limit: int = Query(100, ge=1, le=1000),
    offset: OffsetQuery = 0,
) -> dict:
    when = day or datetime.now(UTC).date()
    if when >= date.max:  # its end is past what datetime holds
        raise UserError(f"day must be before {date.max.isoformat()}", field="day")
    if event_type not in _RESOURCES:
        return {"entries": [], "next_offset": None}
    start = datetime(when.year, when.month, when.day, tzinfo=UTC)
    reader = None if user in services.config.auth.admin_users else user
    end = (start + timedelta(days=1)).timestamp()
    found = await services.audit.read(start.timestamp(), end, reader, _RESOURCES[event_type], limit + 1, offset)
    return {
        "entries": [_entry(event) for event in found[:limit]],
        "next_offset": offset + limit if len(found) > limit else None,
    }
