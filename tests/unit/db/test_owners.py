"""Every listing is scoped to the caller (on both backends): sessions (page, search), training runs, checkpoints
(their own plus every published one), token usage and checkpoint storage. Sessions made before owners were recorded
(owner null) are everyone's."""

from __future__ import annotations

import time

from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.checkpoints import CheckpointRecord, CheckpointStore
from app.db.metadata import MetadataStore, TrainingRun
from app.db.session_views import SessionQuery, SessionViews
from app.db.usage import HOUR_S, UsageStore
from app.storage.paths import CheckpointPath
from tests.conftest import run_on_db

HOUR = 1_800_000 * HOUR_S


def test_each_listing_shows_the_callers_own_and_legacy_objects(db_url: str) -> None:
    async def body(db: AsyncEngine) -> None:
        meta, views, store, usage = MetadataStore(db), SessionViews(db), CheckpointStore(db), UsageStore(db)
        alice = await meta.create_session("0.38", [], {}, owner="user-alice")
        bob = await meta.create_session("0.38", [], {}, owner="user-bob")
        legacy = await meta.create_session("0.25", [], {})  # owner null
        now = time.time()
        for i, session in enumerate((alice, bob, legacy)):
            model_id = f"{session}:train:0"
            run = TrainingRun(model_id, session, "tiny", 8, "policy", "tiny", {"rank": 8}, {}, now + i, False)
            await meta.add_training_run(run)
            for name, public in (("private", False), ("published", True)):
                path = CheckpointPath(model_id, "weights", name)
                await store.commit(CheckpointRecord(path, f"{session}/{name}", 10, now, public=public), False)
            await usage.add(session, "tiny", {"training": 5}, at=HOUR)

        assert sorted((await views.page(10, 0, owner="user-alice"))[0]) == sorted([alice, legacy])
        assert (await views.page(10, 0, owner="user-carol")) == ([legacy], 1)
        assert len((await views.page(10, 0))[0]) == 3  # no owner: every session (for operators)
        found, _ = await views.search(SessionQuery(owner="user-bob"), 10)
        assert sorted(s.session_id for s in found) == sorted([bob, legacy])
        assert (await views.search(SessionQuery(owner="user-bob", session_id=alice), 10))[0] == []

        runs, total = await meta.list_training_runs(10, 0, owner="user-alice")
        assert (sorted(r.session_id for r in runs), total) == (sorted([alice, legacy]), 2)

        readable, total = await store.page(100, 0, readable_by="user-alice")
        uris = {r.path.uri for r in readable}
        assert total == 5 and uris == {
            f"tinker://{alice}:train:0/weights/private",
            f"tinker://{alice}:train:0/weights/published",
            f"tinker://{bob}:train:0/weights/published",
            f"tinker://{legacy}:train:0/weights/private",
            f"tinker://{legacy}:train:0/weights/published",
        }

        assert {row.session_id for row in await usage.hours(HOUR, HOUR + HOUR_S, owner="user-bob")} == {bob, legacy}
        storage = await usage.checkpoint_storage(owner="user-bob")
        assert {run.session_id for run in storage} == {bob, legacy}

    run_on_db(db_url, body)
