"""What a user keeps, on SQLite and PostgreSQL (issue 45 #10, #11): finished sessions' and unloaded runs' metadata
is pruned after its retention while open and live ones and recent ones stay; each user's counts and bytes are
their own."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable

import numpy as np
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.metadata import Kept, MetadataStore, TrainingRun, model_id_for
from app.db.migrate import migrate
from app.db.sampling_sessions import SamplingSession, SamplingSessionStore
from app.db.schema import connect, sessions, training_runs
from app.db.stability import StabilityRecord, StabilityStore

DAY = 86400.0
META = {"k": "v" * 100}
RUN_BYTES = len(json.dumps(META))
SESSION_BYTES = len(json.dumps(["t"])) + RUN_BYTES


def _on_db(db_url: str, body: Callable[[AsyncEngine], Awaitable[None]]) -> None:
    async def main() -> None:
        engine = connect(db_url)
        await migrate(engine)
        try:
            await body(engine)
        finally:
            await engine.dispose()

    asyncio.run(main())


async def _run(store: MetadataStore, session_id: str, seq: int, unloaded: bool) -> str:
    model_id = model_id_for(session_id, seq)
    lora = {"rank": 4, "seed": 1}
    await store.add_training_run(
        TrainingRun(model_id, session_id, "tiny", 4, "policy", "tiny", lora, META, time.time(), unloaded)
    )
    return model_id


async def _age(engine: AsyncEngine, days: float, *, session_ids: list[str], model_ids: list[str]) -> None:
    async with engine.begin() as conn:
        then = time.time() - days * DAY
        await conn.execute(update(sessions).where(sessions.c.session_id.in_(session_ids)).values(created_at=then))
        await conn.execute(update(training_runs).where(training_runs.c.model_id.in_(model_ids)).values(created_at=then))


def test_old_finished_metadata_is_pruned_and_stops_counting(db_url: str) -> None:
    async def body(engine: AsyncEngine) -> None:
        store = MetadataStore(engine)
        old_open, old_done, new_done = [await store.create_session(None, ["t"], META, owner="alice") for _ in "abc"]
        await store.finish_session(old_done, "success")
        await store.finish_session(new_done, "success")
        old_live, old_unloaded = await _run(store, old_open, 0, False), await _run(store, old_open, 1, True)
        new_unloaded = await _run(store, new_done, 0, True)
        await _age(engine, 31, session_ids=[old_open, old_done], model_ids=[old_live, old_unloaded])
        cut_off = time.time() - 30 * DAY
        # counted: the open session and the live run, and what is recent; bytes: all until pruned
        assert await store.kept_by("alice", cut_off) == Kept(2, 2, 3 * SESSION_BYTES + 3 * RUN_BYTES)

        assert await store.prune_metadata(cut_off) == 2  # old_done's tags and metadata, old_unloaded's metadata
        assert await store.prune_metadata(cut_off) == 0
        async with engine.connect() as conn:
            kept = {r.session_id: (r.tags, r.user_metadata) for r in await conn.execute(select(sessions))}
        assert kept == {old_open: (["t"], META), old_done: (None, None), new_done: (["t"], META)}
        assert (await store.get_training_run(old_unloaded)).user_metadata == {}
        assert (await store.get_training_run(old_live)).user_metadata == META
        assert (await store.get_training_run(new_unloaded)).user_metadata == META
        assert await store.kept_by("alice", cut_off) == Kept(2, 2, 2 * SESSION_BYTES + 2 * RUN_BYTES)
        assert await store.kept_by("alice", cut_off, besides=new_unloaded) == Kept(2, 1, 2 * SESSION_BYTES + RUN_BYTES)
        assert await store.kept_by("bob", cut_off) == Kept(0, 0, 0)

    _on_db(db_url, body)


def test_ephemeral_samplers_and_stability_bytes_are_counted_per_user(db_url: str) -> None:
    async def body(engine: AsyncEngine) -> None:
        store, samplers, stability = MetadataStore(engine), SamplingSessionStore(engine), StabilityStore(engine)
        alices = await store.create_session(None, [], {}, owner="alice")
        bobs = await store.create_session(None, [], {}, owner="bob")
        for session_id, seq, ephemeral in ((alices, 0, True), (alices, 1, True), (alices, 2, False), (bobs, 0, True)):
            await samplers.create(
                SamplingSession(f"{session_id}:sample:{seq}", session_id, "tiny", None, None, ephemeral, time.time())
            )
        assert await store.ephemeral_samplers_of("alice", besides="none") == 2
        assert await store.ephemeral_samplers_of("alice", besides=f"{alices}:sample:0") == 1
        prompt, tokens, logprobs = np.arange(10, dtype=np.int32), np.arange(4, dtype=np.int32), np.zeros(4, np.float32)
        for i, session_id in enumerate((alices, alices, bobs)):
            await stability.add([StabilityRecord(f"r:{i}", session_id, None, prompt, tokens, logprobs)])
        assert await stability.bytes_of("alice") == 2 * (40 + 16 + 16)
        assert await stability.bytes_of("carol") == 0

    _on_db(db_url, body)
