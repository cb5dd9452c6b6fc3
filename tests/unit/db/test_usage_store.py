"""UsageStore on SQLite and PostgreSQL: token counts add up per hour, session, base model and kind; checkpoint
storage sums each run's live checkpoints."""

from __future__ import annotations

import time

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.checkpoints import CheckpointRecord, CheckpointStore
from app.db.metadata import MetadataStore, TrainingRun
from app.db.session_views import SessionViews
from app.db.usage import HOUR_S, RunStorage, UsageRow, UsageStore
from app.storage.paths import CheckpointPath
from tests.conftest import run_on_db

HOUR = 1_800_000 * HOUR_S  # an hour boundary


def test_counts_add_up_per_hour_and_kind(db_url: str) -> None:
    async def body(db: AsyncEngine) -> None:
        usage = UsageStore(db)
        await usage.add("s1", "tiny", {"training": 10}, at=HOUR + 5)
        await usage.add("s1", "tiny", {"training": 7, "sampling_prefill": 0}, at=HOUR + 3599)  # zero: no row
        await usage.add("s1", "tiny", {"sampling_prefill": 4, "sampling_sample": 9}, at=HOUR + 60)
        await usage.add("s2", "tiny", {"training": 100}, at=HOUR + 10)
        await usage.add("s1", "tiny", {"training": 1}, at=HOUR + HOUR_S)  # the next hour
        assert await usage.hours(HOUR, HOUR + HOUR_S) == [
            UsageRow(HOUR, "s2", "tiny", "training", 100),
            UsageRow(HOUR, "s1", "tiny", "training", 17),
            UsageRow(HOUR, "s1", "tiny", "sampling_sample", 9),
            UsageRow(HOUR, "s1", "tiny", "sampling_prefill", 4),
        ]
        assert await usage.hours(HOUR + HOUR_S, HOUR + 2 * HOUR_S) == [
            UsageRow(HOUR + HOUR_S, "s1", "tiny", "training", 1)
        ]
        with pytest.raises(ValueError):
            await usage.add("s1", "tiny", {"storage": 1})

    run_on_db(db_url, body)


def test_checkpoint_storage_per_run(db_url: str) -> None:
    async def body(db: AsyncEngine) -> None:
        meta, store, usage = MetadataStore(db), CheckpointStore(db), UsageStore(db)
        s1 = await meta.create_session("0.38", [], {}, project_id="p1")
        s2 = await meta.create_session("0.38", [], {})
        now = time.time()
        for model_id, session, sizes in ((f"{s1}:train:0", s1, (100, 50)), (f"{s2}:train:0", s2, (1000,))):
            await meta.add_training_run(
                TrainingRun(model_id, session, "tiny", 8, "policy", "tiny", {"rank": 8}, {}, now, False)
            )
            for i, size in enumerate(sizes):
                path = CheckpointPath(model_id, "weights", f"c{i}")
                await store.commit(CheckpointRecord(path, f"loc{i}", size, now), overwrite=False)
        expired = CheckpointRecord(CheckpointPath(f"{s1}:train:0", "weights", "old"), "x", 7, now, expires_at=now - 1)
        await store.commit(expired, overwrite=False)
        assert await usage.checkpoint_storage() == [
            RunStorage(f"{s2}:train:0", s2, None, 1, 1000),
            RunStorage(f"{s1}:train:0", s1, "p1", 2, 150),
        ]
        assert await usage.checkpoint_storage("p1") == [RunStorage(f"{s1}:train:0", s1, "p1", 2, 150)]
        await SessionViews(db).set_project(s2, "p1")
        assert [r.size_bytes for r in await usage.checkpoint_storage("p1")] == [1000, 150]

    run_on_db(db_url, body)


def test_record_never_fails_the_request(db_url: str, caplog: pytest.LogCaptureFixture) -> None:
    async def body(db: AsyncEngine) -> None:
        usage = UsageStore(db)
        await usage.record("s1", "tiny", {"training": 3})
        await usage.record("s1", "tiny", {"bogus": 3})  # logged, not raised
        assert [r.token_count for r in await usage.hours(0, 2 * time.time())] == [3]

    run_on_db(db_url, body)
    assert "counting {'bogus': 3} tokens of session s1 failed" in caplog.text
