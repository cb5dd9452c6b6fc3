"""StabilityStore on SQLite and PostgreSQL: records round-trip exactly, belong to their session, stay alive while
read, and expire once unused."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.stability import StabilityRecord, StabilityStore, sequence_ids
from tests.conftest import run_on_db


def _record(sequence_id: str, session_id: str = "s1", n: int = 3) -> StabilityRecord:
    rng = np.random.default_rng(n)
    return StabilityRecord(
        sequence_id=sequence_id,
        session_id=session_id,
        adapter_location="m/sampler_weights/w/v1",
        prompt=np.array([5, 6, 7], dtype=np.int32),
        tokens=rng.integers(0, 2048, n).astype(np.int32),
        logprobs=-rng.random(n).astype(np.float32),
    )


def test_sequence_ids_name_each_sequence_of_a_sample() -> None:
    assert sequence_ids("req", 3) == ["req:0", "req:1", "req:2"]


def test_records_round_trip_per_session(db_url: str) -> None:
    mine, theirs = _record("r:0"), _record("r:1", session_id="s2", n=5)

    async def body(db: AsyncEngine) -> None:
        store = StabilityStore(db)
        await store.add([mine, theirs])
        got = await store.get("s1", ["r:0", "r:1", "unknown:0"], 3)
        assert list(got) == ["r:0"]  # another session's record is as absent as an unknown one
        record = got["r:0"]
        assert record.adapter_location == mine.adapter_location and record.session_id == "s1"
        for name in ("prompt", "tokens", "logprobs"):
            np.testing.assert_array_equal(getattr(record, name), getattr(mine, name))
            assert getattr(record, name).dtype == getattr(mine, name).dtype
        assert record.size_bytes == 3 * 4 + 3 * 8
        assert (await store.count("s1"), await store.count("s2"), await store.count("s3")) == (1, 1, 0)

    run_on_db(db_url, body)


def test_a_request_reads_its_sequences_in_a_few_statements(db_url: str) -> None:
    """Issue 45 #6: 16,384 ids (limits.max_distinct_sequence_ids_per_request's default) in one lookup take 8
    statements, not one pair per 500 ids (5.5M ids made 22k statements on SQLite's one connection); more ids than
    the bound asked for are refused before any statement."""
    ids = [f"r{i}:0" for i in range(16_384)]
    statements: list[str] = []

    async def body(db: AsyncEngine) -> None:
        store = StabilityStore(db)
        await store.add([_record(ids[-1])])
        event.listen(db.sync_engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
        assert list(await store.get("s1", ids, len(ids))) == [ids[-1]]
        assert len(statements) <= 8, len(statements)
        statements.clear()
        with pytest.raises(ValueError, match="16384 sequence ids"):
            await store.get("s1", ids, len(ids) - 1)
        assert statements == []


def test_a_retried_sample_replaces_its_records(db_url: str) -> None:
    async def body(db: AsyncEngine) -> None:
        store = StabilityStore(db)
        await store.add([_record("r:0", n=3)])
        await store.add([_record("r:0", n=5)])  # its sampler died after storing them; the retry sampled anew
        (record,) = (await store.get("s1", ["r:0"], 1)).values()
        assert len(record.tokens) == 5 and await store.count("s1") == 1

    run_on_db(db_url, body)


def test_unused_records_expire_and_reading_keeps_them(db_url: str) -> None:
    async def body(db: AsyncEngine) -> None:
        store = StabilityStore(db)
        await store.add([_record("a:0"), _record("b:0")])
        cutoff = time.time() + 0.01
        await asyncio.sleep(0.05)
        await store.get("s1", ["a:0"], 1)  # used after the cutoff: kept
        assert await store.expire(cutoff) == 1
        assert list(await store.get("s1", ["a:0", "b:0"], 2)) == ["a:0"]
        assert await store.expire(time.time() + 1) == 1
        assert await store.count("s1") == 0

    run_on_db(db_url, body)
