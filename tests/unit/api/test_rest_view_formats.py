"""Pure parts of the REST views: the trace export's Chrome trace-event JSON, session statuses, and the usage
window's checks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from app.api.session_views import status_of
from app.api.traces import trace_json
from app.api.usage import _window
from app.db.session_views import SessionInfo
from app.db.traces import RequestEvent
from app.errors import LimitExceeded, UserError


def test_trace_slices_per_track_with_microsecond_timings() -> None:
    events = [
        RequestEvent("r1", "forward_backward", "s:train:0", 1, "completed", 100.0, 100.25),
        RequestEvent("r2", "sample", "s:sample:0", 1, "failed", 100.5, 101.0),
        RequestEvent("r3", "optim_step", "s:train:0", 2, "pending", 101.0, None),
    ]
    trace = trace_json("s", events, now=103.0)
    names = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert names == {1: "s:train:0", 2: "s:sample:0"}
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert [(e["name"], e["tid"], e["ts"], e["dur"], e["args"]["state"]) for e in slices] == [
        ("forward_backward", 1, 100_000_000, 250_000, "completed"),
        ("sample", 2, 100_500_000, 500_000, "failed"),
        ("optim_step", 1, 101_000_000, 2_000_000, "pending"),  # still pending: up to the export
    ]


def test_statuses() -> None:
    assert status_of(SessionInfo("s", 1.0, None)) == {"type": "active"}
    assert status_of(SessionInfo("s", 1.0, "errored")) == {"type": "client_finished", "reason": {"type": "errored"}}
    assert status_of(SessionInfo("s", 1.0, "expired")) is None


def test_usage_windows() -> None:
    start = datetime(2026, 1, 1, 5, tzinfo=UTC)
    assert _window(start, start + timedelta(hours=2), 24) == (start.timestamp(), start.timestamp() + 7200)
    assert _window(start.replace(tzinfo=None), start + timedelta(hours=1), 24)[0] == start.timestamp()  # naive: UTC
    cases = [
        (start + timedelta(minutes=30), start + timedelta(hours=2), "starting_on", UserError),
        (start, start + timedelta(hours=1, seconds=1), "ending_before", UserError),
        (start, start, "ending_before", UserError),
        (start, start + timedelta(hours=25), "ending_before", LimitExceeded),
        (datetime.now(UTC).replace(minute=0, second=0, microsecond=0) + timedelta(hours=2), None, "starting_on", None),
    ]
    for begin, end, field, kind in cases:
        with pytest.raises(kind or UserError) as err:
            _window(begin, end or begin + timedelta(hours=1), 24)
        assert err.value.field == field
