"""StabilityStore on SQLite and PostgreSQL: records round-trip exactly, belong to their session, stay alive while
read, and expire once unused."""

from __future__ import annotations

import asyncio
import time

import numpy as np
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
        got = await store.get("s1", ["r:0", "r:1", "unknown:0"])
        assert list(got) == ["r:0"]  # another session's record is as absent as an unknown one
        record = got["r:0"]
        assert record.adapter_location == mine.adapter_location and record.session_id == "s1"
        for name in ("prompt", "tokens", "logprobs"):
            np.testing.assert_array_equal(getattr(record, name), getattr(mine, name))
            assert getattr(record, name).dtype == getattr(mine, name).dtype
        assert record.size_bytes == 3 * 4 + 3 * 8
        assert (await store.count("s1"), await store.count("s2"), await store.count("s3")) == (1, 1, 0)

    run_on_db(db_url, body)


def test_a_request_may_name_any_number_of_sequences(db_url: str) -> None:
    """250,001 ids in one lookup (a forward_backward's provenance may name that many): more bound parameters than
    SQLite or PostgreSQL take in one statement, so the store asks in batches."""
    ids = [f"r{i}:0" for i in range(250_001)]

    async def body(db: AsyncEngine) -> None:
        store = StabilityStore(db)
        await store.add([_record(ids[-1])])
        assert list(await store.get("s1", ids)) == [ids[-1]]

    run_on_db(db_url, body)


def test_a_retried_sample_replaces_its_records(db_url: str) -> None:
    async def body(db: AsyncEngine) -> None:
        store = StabilityStore(db)
        await store.add([_record("r:0", n=3)])
        await store.add([_record("r:0", n=5)])  # its sampler died after storing them; the retry sampled anew
        (record,) = (await store.get("s1", ["r:0"])).values()
        assert len(record.tokens) == 5 and await store.count("s1") == 1

    run_on_db(db_url, body)


def test_unused_records_expire_and_reading_keeps_them(db_url: str) -> None:
    async def body(db: AsyncEngine) -> None:
        store = StabilityStore(db)
        await store.add([_record("a:0"), _record("b:0")])
        cutoff = time.time() + 0.01
        await asyncio.sleep(0.05)
        await store.get("s1", ["a:0"])  # used after the cutoff: kept
        assert await store.expire(cutoff) == 1
        assert list(await store.get("s1", ["a:0", "b:0"])) == ["a:0"]
        assert await store.expire(time.time() + 1) == 1
        assert await store.count("s1") == 0

    run_on_db(db_url, body)
