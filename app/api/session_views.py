"""REST views of sessions (RestClient): list, get, search, and moving a session into a project.

Each user sees their own sessions only: `access_scope` and the search's `owner` are accepted and change nothing,
and another user's session answers as a missing one does. A session's status: `active` while open,
`client_finished` with the reason its client gave when closed; a session that expired for want of heartbeats has
none (the SDK's "neither finished nor running").
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from fastapi import APIRouter, Query

from app.api.deps import OffsetQuery, ServicesDep, UserDep
from app.db.session_views import SessionInfo, SessionQuery
from app.errors import UserError
from app.protocol.wire import SessionProjectRequest, SessionSearchRequest, SessionStatusQuery

router = APIRouter(prefix="/api/v1")
CLIENT_REASONS = ("success", "errored", "interrupted")


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat()


def status_of(info: SessionInfo) -> dict | None:
    """The SDK's SessionStatus of a session."""
    if info.finished_reason is None:
        return {"type": "active"}
    if info.finished_reason in CLIENT_REASONS:
        return {"type": "client_finished", "reason": {"type": info.finished_reason}}
    return None


def _status_filter(queries: list[SessionStatusQuery] | None) -> Callable[[SessionInfo], bool]:
    """Whether a session's status matches any of `queries` (None: every session matches)."""

    def matches(info: SessionInfo) -> bool:
        if queries is None:
            return True
        status = status_of(info)
        if status is None:
            return False
        for q in queries:
            if q.type == status["type"] and (q.reasons is None or status["reason"]["type"] in q.reasons):
                return True
        return False

    return matches


def cursor_timestamp(created_at: str) -> float:
    """A cursor's RFC 3339 datetime as a POSIX timestamp (UTC when it names no offset)."""
    try:
        created = datetime.fromisoformat(created_at.replace("Z", "+00:00"))
        return (created if created.tzinfo else created.replace(tzinfo=UTC)).timestamp()
    except (ValueError, OverflowError):  # malformed, or out of datetime's range once in UTC
        raise UserError(
            f"cursor.last_created_at {created_at!r} is not an RFC 3339 datetime from year 1 to 9999",
            field="cursor.last_created_at",
        ) from None


def _query(body: SessionSearchRequest, user: str) -> SessionQuery:
    if body.display_name is not None and not body.display_name.strip():
        raise UserError("display_name must not be empty; leave it out to match every name", field="display_name")
    before = None
    if body.cursor is not None:
        before = (cursor_timestamp(body.cursor.last_created_at), body.cursor.last_session_id)
    return SessionQuery(
        owner=user,
        session_id=body.session_id,
        display_name=body.display_name,
        project_ids=body.project_ids,
        user_metadata=body.user_metadata,
        matches_status=_status_filter(body.statuses),
        before=before,
    )


def _summary(info: SessionInfo, totals: tuple[int, int], owner: str) -> dict:
    return {
        "session_id": info.session_id,
        "created_at": _iso(info.created_at),
        "owner": owner,
        "project_id": info.project_id or "",
        "status": status_of(info),
        "checkpoints_count": totals[0],
        "checkpoint_storage_bytes": totals[1],
        "display_name": info.display_name,
        "user_metadata": {k: str(v) for k, v in info.user_metadata.items()} or None,
    }


@router.get("/sessions")
async def list_sessions(
    services: ServicesDep, user: UserDep, limit: int = Query(20, ge=1, le=1000), offset: OffsetQuery = 0
) -> dict:
    """The caller's session ids, newest first (`cursor` is ours; the SDK reads `sessions`)."""
    ids, total = await services.session_views.page(limit, offset, owner=user)
    return {"sessions": ids, "cursor": {"offset": offset, "limit": limit, "total_count": total}}


@router.post("/sessions/search")
async def search_sessions(body: SessionSearchRequest, services: ServicesDep, user: UserDep) -> dict:
    found, more = await services.session_views.search(_query(body, user), body.limit)
    totals = await services.session_views.checkpoint_totals([s.session_id for s in found])
    last = found[-1] if more else None
    return {
        "sessions": [_summary(s, totals.get(s.session_id, (0, 0)), user) for s in found],
        "next_cursor": None
        if last is None
        else {"last_created_at": _iso(last.created_at), "last_session_id": last.session_id},
    }


@router.get("/sessions/{session_id}")
async def get_session(session_id: str, services: ServicesDep, user: UserDep) -> dict:
    await services.session(session_id, user)
    info = await services.session_views.get(session_id)
    runs, samplers = await services.session_views.members(session_id)
    return {
        "training_run_ids": runs,
        "sampler_ids": samplers,
        "user_metadata": {k: str(v) for k, v in info.user_metadata.items()} or None,
        "display_name": info.display_name,
    }


@router.put("/sessions/{session_id}/project")
async def assign_project(session_id: str, body: SessionProjectRequest, services: ServicesDep, user: UserDep) -> None:
    if not body.project_id:
        raise UserError("send the destination project_id", field="project_id")
    await services.session(session_id, user)
    await services.session_views.set_project(session_id, body.project_id)
