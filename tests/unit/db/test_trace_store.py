"""TraceStore on SQLite and PostgreSQL: every future is filed under its session with its timings, and trimming
keeps each session's newest requests. Also the idempotency log of copy_weights."""

from __future__ import annotations

import asyncio

from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.copies import CopyLog
from app.db.futures import JSON_CONTENT_TYPE, FutureStore
from app.db.traces import TraceStore
from tests.conftest import run_on_db


def test_futures_are_filed_under_their_session_and_trimmed(db_url: str) -> None:
    async def body(db: AsyncEngine) -> None:
        futures, traces = FutureStore(db), TraceStore(db)
        first, _ = await futures.create("forward_backward", "s1:train:0", 1)
        await asyncio.sleep(0.01)
        await futures.complete(first, b"{}", JSON_CONTENT_TYPE)
        second, _ = await futures.create("sample", "s1:sample:0", 1)
        await futures.fail(second, {"error": "no"})
        third, _ = await futures.create("optim_step", "s1:train:0", 2)
        await futures.create("forward_backward", "s2:train:0", 1)
        retried, created = await futures.create("forward_backward", "s1:train:0", 1)  # a retry files nothing new
        assert (retried, created) == (first, False)

        events = await traces.events("s1", 10)
        assert [(e.request_id, e.kind, e.model_id, e.state) for e in events] == [
            (first, "forward_backward", "s1:train:0", "completed"),
            (second, "sample", "s1:sample:0", "failed"),
            (third, "optim_step", "s1:train:0", "pending"),
        ]
        assert events[0].completed_at is not None and events[0].completed_at - events[0].created_at >= 0.01
        assert events[2].completed_at is None
        assert [e.request_id for e in await traces.events("s1", 2)] == [second, third]  # the newest two

        assert await traces.trim(keep=2) == 1
        assert [e.request_id for e in await traces.events("s1", 10)] == [second, third]
        assert len(await traces.events("s2", 10)) == 1
        assert await traces.trim(keep=2) == 0

    run_on_db(db_url, body)


def test_copy_log_answers_the_first_copy(db_url: str) -> None:
    async def body(db: AsyncEngine) -> None:
        log = CopyLog(db)
        assert await log.find("k") is None
        await log.remember("k", "tinker://a:train:0/weights/c")
        await log.remember("k", "tinker://b:train:0/weights/c")  # a concurrent retry: the first answer stands
        assert await log.find("k") == "tinker://a:train:0/weights/c"

    run_on_db(db_url, body)
