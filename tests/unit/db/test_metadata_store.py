"""MetadataStore on SQLite and PostgreSQL: sessions and training runs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TypeVar

import pytest
from sqlalchemy import select

from app.db.metadata import MetadataStore, TrainingRun, model_id_for
from app.db.migrate import migrate
from app.db.schema import connect, sessions
from app.errors import NotFound, UserError

T = TypeVar("T")


def run_with_store(db: str, body: Callable[[MetadataStore, object], Awaitable[T]]) -> T:
    async def main() -> T:
        engine = connect(db)
        await migrate(engine)
        try:
            return await body(MetadataStore(engine), engine)
        finally:
            await engine.dispose()

    return asyncio.run(main())


def _run(model_id: str, session_id: str = "sess", role: str = "policy") -> TrainingRun:
    trainer = "tinker-serve/tiny:critic" if role == "critic" else "tinker-serve/tiny"
    return TrainingRun(
        model_id=model_id,
        session_id=session_id,
        base_model="tinker-serve/tiny",
        lora_rank=8,
        role=role,
        trainer=trainer,
        lora_config={"rank": 8, "seed": 3, "train_mlp": False},
        user_metadata={"k": "v"},
        created_at=123.5,
        unloaded=False,
    )


async def _session_row(engine, session_id: str):
    async with engine.connect() as conn:
        return (await conn.execute(select(sessions).where(sessions.c.session_id == session_id))).first()


def test_model_id_format() -> None:
    assert model_id_for("abc123", 0) == "abc123:train:0"
    assert model_id_for("s", 42) == "s:train:42"


def test_session_lifecycle(db_url: str) -> None:
    async def body(store: MetadataStore, engine) -> None:
        before = time.time()
        sid = await store.create_session("0.9.0", ["a", "b"], {"user": "me"}, owner="user-alice")
        assert len(sid) == 16
        row = await _session_row(engine, sid)
        assert (row.sdk_version, row.tags, row.user_metadata, row.finished_reason) == (
            "0.9.0",
            ["a", "b"],
            {"user": "me"},
            None,
        )
        assert row.created_at >= before
        assert await store.owner_of(sid) == "user-alice"
        assert await store.owner_of(await store.create_session(None, [], {})) is None  # made outside any request

        await asyncio.sleep(0.01)
        assert await store.heartbeat(sid) is True
        assert (await _session_row(engine, sid)).last_heartbeat > row.last_heartbeat
        assert await store.heartbeat("no-such-session") is False

        await store.finish_session(sid, "client_closed")
        await store.finish_session(sid, "expired")  # the first reason sticks
        assert (await _session_row(engine, sid)).finished_reason == "client_closed"

    run_with_store(db_url, body)


def test_owner_of_unknown_session(db_url: str) -> None:
    async def body(store: MetadataStore, _engine) -> None:
        with pytest.raises(NotFound) as info:
            await store.owner_of("missing")
        assert info.value.field == "session_id"
        assert info.value.status_code == 404

    run_with_store(db_url, body)


def test_training_run_round_trip(db_url: str) -> None:
    async def body(store: MetadataStore, _engine) -> TrainingRun:
        await store.add_training_run(_run("sess:train:0"))
        await store.add_training_run(_run("sess:train:1"))
        await store.mark_unloaded("sess:train:1")
        assert (await store.get_training_run("sess:train:1")).unloaded is True
        return await store.get_training_run("sess:train:0")

    assert run_with_store(db_url, body) == _run("sess:train:0")


def test_routing_table(db_url: str) -> None:
    async def body(store: MetadataStore, _engine) -> None:
        await store.add_training_run(_run("sess:train:0"))
        await store.add_training_run(_run("sess:train:1", role="critic"))
        await store.add_training_run(_run("sess:train:2"))
        critic = await store.get_training_run("sess:train:1")
        assert (critic.role, critic.trainer) == ("critic", "tinker-serve/tiny:critic")
        assert sorted(await store.live_model_ids_on("tinker-serve/tiny")) == ["sess:train:0", "sess:train:2"]
        assert await store.live_model_ids_on("tinker-serve/tiny:critic") == ["sess:train:1"]
        assert await store.live_model_ids_on("other") == []

    run_with_store(db_url, body)


def test_duplicate_model_id(db_url: str) -> None:
    async def body(store: MetadataStore, _engine) -> None:
        await store.add_training_run(_run("sess:train:0"))
        with pytest.raises(UserError) as info:
            await store.add_training_run(_run("sess:train:0"))
        assert info.value.field == "model_seq_id"
        assert "sess:train:0" in info.value.message

    run_with_store(db_url, body)


def test_unknown_training_run(db_url: str) -> None:
    async def body(store: MetadataStore, _engine) -> None:
        with pytest.raises(NotFound) as info:
            await store.get_training_run("sess:train:9")
        assert info.value.field == "model_id"

    run_with_store(db_url, body)


def test_runs_survive_new_engine(db_url: str) -> None:
    db = db_url

    async def write(store: MetadataStore, _engine) -> None:
        await store.add_training_run(_run("sess:train:5"))

    async def read(store: MetadataStore, _engine) -> TrainingRun:
        return await store.get_training_run("sess:train:5")

    run_with_store(db, write)
    assert run_with_store(db, read) == _run("sess:train:5")


def test_training_runs_page_newest_first(db_url: str) -> None:
    async def body(store: MetadataStore, _engine) -> None:
        for i in range(5):
            await store.add_training_run(replace(_run(f"sess:train:{i}"), created_at=100.0 + i))
        first, total = await store.list_training_runs(limit=2, offset=0)
        assert total == 5 and [r.model_id for r in first] == ["sess:train:4", "sess:train:3"]
        rest, _ = await store.list_training_runs(limit=10, offset=2)
        assert [r.model_id for r in rest] == ["sess:train:2", "sess:train:1", "sess:train:0"]
        assert (await store.list_training_runs(limit=3, offset=5))[0] == []

    run_with_store(db_url, body)


def test_silent_sessions_expire_and_stop_heartbeating(db_url: str) -> None:
    async def body(store: MetadataStore, _engine) -> None:
        silent, alive, closed = [await store.create_session(None, [], {}) for _ in range(3)]
        await store.finish_session(closed, "success")
        cutoff = time.time() + 1  # everything beats before it...
        await store.heartbeat(alive)
        assert sorted(await store.expire_sessions(cutoff - 60)) == []  # ...but nothing is silent for a minute
        assert sorted(await store.expire_sessions(cutoff)) == sorted([silent, alive])
        assert await store.expire_sessions(cutoff) == []  # already finished
        assert await store.heartbeat(silent) is False  # the SDK stops beating on 410
        await store.add_training_run(_run("x:train:0", session_id=silent))
        await store.add_training_run(_run("x:train:1", session_id=silent))
        await store.mark_unloaded("x:train:1")
        assert [r.model_id for r in await store.loaded_runs_of(silent)] == ["x:train:0"]

    run_with_store(db_url, body)
