"""Session trace export: `trace_export` answers at once with a signed link (no API key needed, as the CLI fetches
it with plain urllib); the link builds the trace from the session's recorded requests when fetched.

The trace is Chrome trace-event JSON, which https://ui.perfetto.dev opens: the session is one process, each
training run and sampling session one track, each request one slice from when its future was created to when it
finished (still pending: up to the export), named by kind, with its request id, seq_id and outcome.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from fastapi import APIRouter, Query, Request

from app.api.deps import ServicesDep, UserDep
from app.api.signatures import sign, signature_valid
from app.db.traces import RequestEvent
from app.errors import Forbidden

router = APIRouter(prefix="/api/v1")
TRACE_PREFIX = "/api/v1/traces/"


def trace_json(session_id: str, events: Iterable[RequestEvent], now: float) -> dict:
    """Chrome trace-event JSON of one session's requests (timestamps in microseconds since the epoch)."""
    tracks: dict[str, int] = {}
    slices = []
    for e in events:
        tid = tracks.setdefault(e.model_id, len(tracks) + 1)
        end = e.completed_at if e.completed_at is not None else now
        slices.append(
            {
                "name": e.kind,
                "cat": "sample" if e.kind == "sample" else "train",
                "ph": "X",
                "pid": 1,
                "tid": tid,
                "ts": round(e.created_at * 1e6),
                "dur": max(0, round((end - e.created_at) * 1e6)),
                "args": {"request_id": e.request_id, "model_id": e.model_id, "seq_id": e.seq_id, "state": e.state},
            }
        )
    names = [{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": f"session {session_id}"}}]
    names += [{"name": "thread_name", "ph": "M", "pid": 1, "tid": t, "args": {"name": m}} for m, t in tracks.items()]
    return {"traceEvents": names + slices, "displayTimeUnit": "ms", "otherData": {"session_id": session_id}}


@router.get("/sessions/{session_id}/trace_export")
async def trace_export(session_id: str, request: Request, services: ServicesDep, user: UserDep) -> dict:
    """Ready at once: the link builds the trace when fetched (valid retention.download_url_ttl_seconds)."""
    await services.session(session_id, user)
    expires = int(time.time()) + services.config.retention.download_url_ttl_seconds
    signature = sign(services.url_signing_key, f"trace/{session_id}", expires)
    url = f"{str(request.base_url).rstrip('/')}{TRACE_PREFIX}{session_id}?expires={expires}&signature={signature}"
    return {"status": "ready", "url": url}


@router.get("/traces/{session_id}")
async def trace(session_id: str, services: ServicesDep, expires: int = Query(...), signature: str = Query(...)) -> dict:
    if not signature_valid(services.url_signing_key, f"trace/{session_id}", expires, signature):
        raise Forbidden("this trace link is not valid; export the trace again", field="signature")
    if time.time() > expires:
        raise Forbidden("this trace link expired; export the trace again", field="expires")
    await services.session_views.get(session_id)
    events = await services.traces.events(session_id, services.config.retention.max_trace_events_per_session)
    return trace_json(session_id, events, time.time())
