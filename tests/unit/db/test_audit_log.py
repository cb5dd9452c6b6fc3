"""AuditLog on both backends: a reader sees the events they did and those about their objects, admins (reader None)
every event; a window and a name prefix narrow it; the log has no way to change or remove an event."""

from __future__ import annotations

import time

from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.audit import AuditLog
from tests.conftest import run_on_db


def test_readers_see_their_own_and_what_concerns_them(db_url: str) -> None:
    async def body(db: AsyncEngine) -> None:
        log = AuditLog(db)
        start = time.time()
        await log.record("checkpoint_published", "alice", {"tinker_path": "tinker://a:train:0/weights/x"})
        await log.record("checkpoint_read", "bob", {"purpose": "sample"}, subject_owner="alice")
        await log.record("apikey_revoked", "console", {"key_id": 3}, subject_owner="carol")
        await log.record("model_created", "alice", {"model_id": "a:train:1"}, subject_owner="alice")  # her own
        end = time.time() + 1

        def names(events: list) -> list[str]:
            return [e.event for e in events]

        alices = await log.read(start, end, "alice")
        assert names(alices) == ["checkpoint_published", "checkpoint_read", "model_created"]
        assert alices[1].actor == "bob" and alices[1].subject_owner == "alice" and alices[2].subject_owner is None
        assert names(await log.read(start, end, "bob")) == ["checkpoint_read"]
        assert names(await log.read(start, end, "carol")) == ["apikey_revoked"]
        assert len(await log.read(start, end, None)) == 4
        assert names(await log.read(start, end, None, "checkpoint_")) == ["checkpoint_published", "checkpoint_read"]
        assert await log.read(end, end + 10, None) == []
        # nothing rewrites an event: only retention removes the old ones
        assert not [m for m in dir(log) if not m.startswith("_") and m not in ("record", "read", "expire")]

    run_on_db(db_url, body)
