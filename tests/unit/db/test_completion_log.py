"""Sampling sessions' completion queues (retrieve_futures) on SQLite and PostgreSQL, fed by FutureStore."""

from __future__ import annotations

import asyncio
import time

from app.db.completions import TRIM_EVERY, Completion, Target, target_of
from app.db.futures import PROTO_CONTENT_TYPE, Failed, FutureStore
from app.db.schema import connect
from tests.unit.db.test_future_store import run_with_store

SESSION = "s:sample:0"
ORIGINAL, CLONE = Target(SESSION, 0), Target(SESSION, 2)


def test_targets_split_seq_ids_by_clone() -> None:
    assert target_of(SESSION, 7) == ORIGINAL
    assert target_of(SESSION, 2_000_000_003) == CLONE


def test_finished_samples_join_their_queue_in_order(db_url: str) -> None:
    async def body(store: FutureStore) -> None:
        first, _ = await store.create("sample", SESSION, 1)
        second, _ = await store.create("sample", SESSION, 2)
        cloned, _ = await store.create("sample", SESSION, 2_000_000_001)
        training, _ = await store.create("forward_backward", "s:train:0", 1)
        await store.complete(second, b"12345", PROTO_CONTENT_TYPE)
        await store.complete(training, b"x", PROTO_CONTENT_TYPE)  # not a sample: in no queue
        await store.fail(first, {"error": "boom", "category": "server"})
        await store.complete(cloned, b"1", PROTO_CONTENT_TYPE)
        await store.complete(second, b"again", PROTO_CONTENT_TYPE)  # finished already: nothing changes
        log = store.completions
        assert await log.read(ORIGINAL, 0) == [
            Completion(1, second, "finished", 5),
            Completion(2, first, "failed", None),
        ]
        assert await log.read(CLONE, 0) == [Completion(1, cloned, "finished", 1)]
        assert await log.read(ORIGINAL, 1) == [Completion(2, first, "failed", None)]
        assert [c.to_wire() for c in await log.read(ORIGINAL, 0)] == [
            {"state": "finished", "request_id": second, "response_payload_uncompressed_size": 5},
            {"state": "failed", "request_id": first},
        ]

    run_with_store(db_url, body)


def test_trim_keeps_the_last_seen_so_numbers_go_on(db_url: str) -> None:
    async def body(store: FutureStore) -> None:
        ids = [(await store.create("sample", SESSION, seq))[0] for seq in (1, 2, 3)]
        for request_id in ids[:2]:
            await store.complete(request_id, b"p", PROTO_CONTENT_TYPE)
        await store.completions.trim(ORIGINAL, 2)
        assert [c.cursor for c in await store.completions.read(ORIGINAL, 0)] == [2]
        await store.complete(ids[2], b"p", PROTO_CONTENT_TYPE)
        assert await store.completions.read(ORIGINAL, 2) == [Completion(3, ids[2], "finished", 1)]

    run_with_store(db_url, body)


def test_stale_and_cancelled_samples_are_reported_failed(db_url: str) -> None:
    async def body(store: FutureStore) -> None:
        stale, _ = await store.create("sample", SESSION, 1)
        doomed, _ = await store.create("sample", SESSION, 2)
        row = await store.cancel(doomed, {"error": "cancelled", "category": "user"})
        assert row is not None and (row.request_id, row.kind, row.subject_id, row.seq_id) == (
            doomed,
            "sample",
            SESSION,
            2,
        )
        assert await store.cancel(doomed, {"error": "again"}) is None  # finished: nothing to cancel
        assert await store.get(doomed) == Failed(doomed, {"error": "cancelled", "category": "user"})
        assert await store.fail_stale("sample", time.time() + 1, {"error": "stale", "category": "server"}) == 1
        assert [(c.request_id, c.state) for c in await store.completions.read(ORIGINAL, 0)] == [
            (doomed, "failed"),
            (stale, "failed"),
        ]

    run_with_store(db_url, body)


def test_wait_wakes_when_a_tracked_sample_finishes_here(db_url: str) -> None:
    async def body(store: FutureStore) -> tuple[list[Completion], float, list[Completion]]:
        request_id, _ = await store.create("sample", SESSION, 1)

        async def finish_later() -> None:
            await asyncio.sleep(0.2)
            await store.complete(request_id, b"p", PROTO_CONTENT_TYPE)

        task = asyncio.create_task(finish_later())
        start = time.monotonic()
        found = await store.completions.wait(ORIGINAL, 0, timeout_s=10)
        elapsed = time.monotonic() - start
        await task
        return found, elapsed, await store.completions.wait(ORIGINAL, found[-1].cursor, timeout_s=0.3)

    found, elapsed, nothing = run_with_store(db_url, body, poll_interval_s=80.0)  # its first timer: 5 s
    assert [c.cursor for c in found] == [1] and elapsed < 2.0
    assert nothing == []


def test_wait_sees_another_replicas_completion_by_polling(db_url: str) -> None:
    db = db_url

    async def body(first: FutureStore) -> tuple[list[Completion], float]:
        request_id, _ = await first.create("sample", SESSION, 1)
        engine = connect(db)
        second = FutureStore(engine, poll_interval_s=0.2)  # another replica: none of its waiters are woken

        async def finish_later() -> None:
            await asyncio.sleep(0.3)
            await first.complete(request_id, b"p", PROTO_CONTENT_TYPE)

        try:
            task = asyncio.create_task(finish_later())
            start = time.monotonic()
            found = await second.completions.wait(ORIGINAL, 0, timeout_s=10)
            await task
            return found, time.monotonic() - start
        finally:
            await engine.dispose()

    found, elapsed = run_with_store(db, body)
    assert [c.cursor for c in found] == [1] and elapsed < 2.0


def test_a_busy_poller_trims_only_every_so_often(db_url: str) -> None:
    async def body(store: FutureStore) -> None:
        for seq in range(1, TRIM_EVERY + 2):
            request_id, _ = await store.create("sample", SESSION, seq)
            await store.complete(request_id, b"p", PROTO_CONTENT_TYPE)
        log = store.completions
        await log.trim(ORIGINAL, 3, idle=False)  # too few seen to spend a write on
        assert len(await log.read(ORIGINAL, 0)) == TRIM_EVERY + 1
        await log.trim(ORIGINAL, TRIM_EVERY, idle=False)
        assert [c.cursor for c in await log.read(ORIGINAL, 0)] == [TRIM_EVERY, TRIM_EVERY + 1]

    run_with_store(db_url, body)


def test_samples_finishing_together_get_distinct_cursors(db_url: str) -> None:
    """Many samples of one queue finishing at once (on Postgres their cursor inserts race and retry)."""

    async def body(store: FutureStore) -> tuple[list[str], list[Completion]]:
        ids = [(await store.create("sample", SESSION, seq))[0] for seq in range(1, 13)]
        await asyncio.gather(*(store.complete(request_id, b"p", PROTO_CONTENT_TYPE) for request_id in ids))
        return ids, await store.completions.read(ORIGINAL, 0)

    ids, found = run_with_store(db_url, body)
    assert [c.cursor for c in found] == list(range(1, 13))
    assert sorted(c.request_id for c in found) == sorted(ids)
