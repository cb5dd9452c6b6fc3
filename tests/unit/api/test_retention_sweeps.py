"""Retention (issue 31): finished futures and old audit events are swept over a real SQLite file, `GET /audit` is
paged, and reading another user's published checkpoint in a loop is audited once."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.audit import AuditLog
from app.db.futures import Completed, FutureStore, Pending, Unknown
from app.db.journal import JournalStore
from app.db.schema import audit_events
from app.messages import AdapterSpec
from app.operations.create_model import CreateModel
from tests.conftest import run_on_db
from tests.unit.api.conftest import InProcessApi, saved_checkpoint


def test_finished_futures_expire_but_pending_and_journaled_ones_stay(tmp_path: Path) -> None:
    async def body(db: AsyncEngine) -> None:
        futures, journal = FutureStore(db), JournalStore(db)
        old_done, _ = await futures.create("forward_backward", "s1:train:0", 1)
        journaled, _ = await futures.create("create_model", "s1:train:0", 0)
        pending, _ = await futures.create("forward_backward", "s1:train:0", 2)
        for request_id in (old_done, journaled):
            await futures.complete(request_id, b"{}", "application/json")
        adapter = AdapterSpec(rank=4, seed=1, train_attn=True, train_mlp=True, role="policy", optimizer="adamw")
        await journal.append("s1:train:0", 0, CreateModel(journaled, adapter, None))
        assert await futures.expire_finished(time.time() - 60) == 0  # finished just now: kept
        recent, _ = await futures.create("forward_backward", "s1:train:0", 3)
        await futures.complete(recent, b"{}", "application/json")
        cutoff = time.time()
        assert await futures.expire_finished(cutoff, batch=1) == 2  # the journaled one stays; batches of one
        assert isinstance(await futures.get(old_done), Unknown)
        assert isinstance(await futures.get(journaled), Completed)
        assert isinstance(await futures.get(pending), Pending)
        assert isinstance(await futures.get(recent), Unknown)

    run_on_db(tmp_path / "futures.sqlite", body)


def test_old_audit_events_expire(tmp_path: Path) -> None:
    async def body(db: AsyncEngine) -> None:
        audit = AuditLog(db)
        for name in ("old", "new"):
            await audit.record("checkpoint_published", "alice", {"name": name})
        async with db.begin() as conn:
            await conn.execute(update(audit_events).where(audit_events.c.event_id == 1).values(at=time.time() - 86400))
        assert await audit.expire(time.time() - 3600) == 1
        left = await audit.read(0, time.time() + 1, None)
        assert [e.details["name"] for e in left] == ["new"]

    run_on_db(tmp_path / "audit.sqlite", body)


def test_audit_is_paged(api: InProcessApi) -> None:
    user = api.user_id()
    for i in range(5):
        api.run(api.services.audit.record("checkpoint_published", user, {"i": i}))
    page = {"event_type": "checkpoints", "limit": 2}  # the key's enrolment is an event too
    first = api.get("/api/v1/audit", params=page).json()
    assert [e["event_details"]["i"] for e in first["entries"]] == [0, 1] and first["next_offset"] == 2
    last = api.get("/api/v1/audit", params={**page, "offset": 4}).json()
    assert [e["event_details"]["i"] for e in last["entries"]] == [4] and last["next_offset"] is None
    assert len(api.get("/api/v1/audit", params={"event_type": "checkpoints"}).json()["entries"]) == 5  # default 100
    too_big = api.get("/api/v1/audit", params={"limit": 1001})
    assert too_big.status_code == 400 and too_big.json()["field"] == "query.limit"


def test_published_checkpoint_read_in_a_loop_is_audited_once(make_api: Callable[..., InProcessApi]) -> None:
    api = make_api(audit_read_dedupe_seconds=3600)
    path = saved_checkpoint(api, "bob", public=True)
    for _ in range(5):
        assert api.post("/api/v1/weights_info", {"tinker_path": path.uri}, "alice").status_code == 200
    reads = [e for e in api.get("/api/v1/audit", "bob").json()["entries"] if e["event"] == "checkpoint_read"]
    assert len(reads) == 1 and reads[0]["purpose"] == "weights_info"
