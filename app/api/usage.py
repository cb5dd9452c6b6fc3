"""Usage (AdminClient, `tinker billing`): hourly token counts per session, and checkpoint storage per run.

Counts are real (app.db.usage says when each is taken), and each user sees their own sessions' only. This server
prices nothing: every cost and rate is null. Storage rows are per training run (`training_run_id` and `session_id`
ride along beside the SDK's fields).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from fastapi import APIRouter

from app.api.deps import ServicesDep, UserDep
from app.db.session_views import SessionInfo
from app.db.usage import HOUR_S, UsageRow
from app.errors import LimitExceeded, NotFound, UserError

router = APIRouter(prefix="/api/v1")
GIGABYTE = 10**9


def _hour(value: datetime, field: str) -> float:
    """An hour-aligned instant (naive means UTC) as a timestamp; a user error naming `field` otherwise."""
    when = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    if (when.minute, when.second, when.microsecond) != (0, 0, 0):
        raise UserError(f"{field} must be on a UTC hour boundary, got {value.isoformat()}", field=field)
    return when.timestamp()


def _window(starting_on: datetime, ending_before: datetime, max_hours: int) -> tuple[float, float]:
    start, end = _hour(starting_on, "starting_on"), _hour(ending_before, "ending_before")
    if start > time.time():
        raise UserError("starting_on is in the future", field="starting_on")
    if end <= start:
        raise UserError("ending_before must be after starting_on", field="ending_before")
    if end - start > max_hours * HOUR_S:
        raise LimitExceeded(
            f"the window spans {(end - start) / HOUR_S:g} hours, over limits.max_usage_window_hours={max_hours}",
            field="ending_before",
        )
    return start, end


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat()


def _event(row: UsageRow, project_id: str | None) -> dict:
    info: dict = {"type": row.kind, "token_count": row.token_count}
    if row.kind == "sampling_prefill":
        info["cached"] = False  # prefix-cache hits are not told apart
    return {
        "bucket_start": _iso(row.bucket_start),
        "bucket_end": _iso(row.bucket_start + HOUR_S),
        "base_model": row.base_model,
        "session_id": row.session_id,
        "project_id": project_id,
        "estimated_cost_usd": None,
        "event_info": info,
    }


@router.get("/billing/usage/events")
async def usage_events(starting_on: datetime, ending_before: datetime, services: ServicesDep, user: UserDep) -> dict:
    start, end = _window(starting_on, ending_before, services.config.limits.max_usage_window_hours)
    rows = await services.usage.hours(start, end, owner=user)
    sessions: dict[str, SessionInfo | None] = {}
    for session_id in dict.fromkeys(row.session_id for row in rows):
        try:
            sessions[session_id] = await services.session_views.get(session_id)
        except NotFound:
            sessions[session_id] = None
    return {
        "data": [_event(row, info.project_id if (info := sessions[row.session_id]) else None) for row in rows],
        "sessions": {
            sid: {"user_metadata": ({k: str(v) for k, v in info.user_metadata.items()} or None) if info else None}
            for sid, info in sessions.items()
        },
        "cost_data_through": None,
    }


@router.get("/billing/usage/checkpoints/current")
async def checkpoint_storage(services: ServicesDep, user: UserDep, project_id: str | None = None) -> dict:
    runs = await services.usage.checkpoint_storage(project_id, owner=user)
    return {
        "effective_rate_usd_per_gigabyte_month": None,
        "data": [
            {
                "project_id": run.project_id,
                "training_run_id": run.model_id,
                "session_id": run.session_id,
                "checkpoint_count": run.checkpoint_count,
                "size_bytes": run.size_bytes,
                "size_gigabytes": run.size_bytes / GIGABYTE,
                "estimated_monthly_cost_usd": None,
            }
            for run in runs
        ],
    }
