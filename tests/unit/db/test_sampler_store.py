"""SamplingSessionStore and the expiry sweep on SQLite and PostgreSQL and real local storage."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import pytest

from app.db.sampling_sessions import SamplingSession, SamplingSessionStore, sampling_session_id_for
from app.errors import NotFound
from app.sampling.expiry import sweep_expired_samplers
from app.storage.objects import ObjectStorage
from tests.conftest import run_on_db


def _session(sid: str, *, ephemeral: bool, last_used_at: float, location: str | None = None) -> SamplingSession:
    return SamplingSession(
        sampling_session_id=sid,
        session_id="sess",
        base_model="tinker-serve/tiny",
        model_path=None,
        adapter_location=location,
        ephemeral=ephemeral,
        last_used_at=last_used_at,
    )


def run(db: str, body) -> object:
    return run_on_db(db, lambda database: body(SamplingSessionStore(database)))


def test_ids_follow_the_hosted_convention() -> None:
    assert sampling_session_id_for("abc", 3) == "abc:sample:3"


def test_create_is_idempotent_and_get_round_trips(db_url: str) -> None:
    async def body(store: SamplingSessionStore) -> None:
        first = _session("s:sample:0", ephemeral=False, last_used_at=10.0, location="m/sampler_weights/a/v1")
        assert await store.create(first) == first
        retried = await store.create(_session("s:sample:0", ephemeral=True, last_used_at=99.0))
        assert retried == first  # a retried create keeps what was stored
        assert await store.get("s:sample:0") == first
        with pytest.raises(NotFound, match="does not exist"):
            await store.get("missing")

    run(db_url, body)


def test_sweep_removes_only_expired_ephemeral_sessions_and_their_files(db_url: str, tmp_path: Path) -> None:
    now = time.time()
    storage = ObjectStorage(str(tmp_path / "storage"))
    for name in ("old", "fresh", "named"):
        storage.write(
            f"ephemeral/{name}", lambda out: (out.mkdir(), (out / "adapter_model.safetensors").write_bytes(b"x"))
        )

    async def body(store: SamplingSessionStore) -> list[str]:
        await store.create(_session("old", ephemeral=True, last_used_at=now - 100, location="ephemeral/old"))
        await store.create(_session("fresh", ephemeral=True, last_used_at=now - 100, location="ephemeral/fresh"))
        await store.create(_session("named", ephemeral=False, last_used_at=now - 100, location="ephemeral/named"))
        await store.touch("fresh", now)
        assert await sweep_expired_samplers(store, storage, ttl_s=50) == 1
        assert await sweep_expired_samplers(store, storage, ttl_s=50) == 0
        kept = []
        for sid in ("old", "fresh", "named"):
            with contextlib.suppress(NotFound):
                kept.append((await store.get(sid)).sampling_session_id)
        return kept

    assert run(db_url, body) == ["fresh", "named"]
    with pytest.raises(FileNotFoundError):
        storage.files("ephemeral/old")
    assert storage.files("ephemeral/fresh") and storage.files("ephemeral/named")


def test_join_numbers_clients_per_session(db_url: str) -> None:
    async def body(store: SamplingSessionStore) -> list[int]:
        return [await store.join("s:sample:0"), await store.join("s:sample:0"), await store.join("s:sample:1")]

    assert run(db_url, body) == [1, 2, 1]  # the original client of each session is 0


def test_concurrent_joins_get_distinct_numbers(db_url: str) -> None:
    """Replicas joining one sampling session at once (on Postgres they race for the same number and retry)."""

    async def body(store: SamplingSessionStore) -> list[int]:
        return list(await asyncio.gather(*(store.join("s:sample:0") for _ in range(12))))

    assert sorted(run(db_url, body)) == list(range(1, 13))
