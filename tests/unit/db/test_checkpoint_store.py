"""CheckpointStore on SQLite and PostgreSQL: commit (refused, or overwrite returning the replaced location),
expiry, publish, paging and delete; and the schema-version check of the database."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from app.db.checkpoints import CheckpointRecord, CheckpointStore
from app.errors import NotFound, UserError
from app.storage.paths import checkpoint_path
from tests.conftest import run_on_db

T = TypeVar("T")


def run_with_store(db: str, body: Callable[[CheckpointStore], Awaitable[T]]) -> T:
    return run_on_db(db, lambda database: body(CheckpointStore(database)))


def _record(
    name: str, created_at: float, kind: str = "weights", expires_at: float | None = None, model_id: str = "s:train:0"
) -> CheckpointRecord:
    path = checkpoint_path(model_id, kind, name)
    return CheckpointRecord(path, path.new_location(), 10, created_at, expires_at, False, {"step": name})


def test_commit_refuses_or_overwrites(db_url: str) -> None:
    async def body(store: CheckpointStore) -> None:
        first = _record("c1", 1.0)
        assert await store.commit(first, overwrite=False) is None
        assert await store.get(first.path) == first
        with pytest.raises(UserError, match="already exists") as info:
            await store.commit(_record("c1", 2.0), overwrite=False)
        assert info.value.field == "path"
        second = _record("c1", 3.0)
        assert await store.commit(second, overwrite=True) == first.location  # the caller removes its files
        assert (await store.get(first.path)).location == second.location
        assert (await store.delete(first.path)) == second
        assert await store.delete(first.path) is None
        with pytest.raises(NotFound, match="does not exist"):
            await store.get(first.path)

    run_with_store(db_url, body)


def test_expiry_hides_at_once_and_the_sweep_finds_it(db_url: str) -> None:
    async def body(store: CheckpointStore) -> None:
        now = time.time()
        expired = _record("old", 1.0, expires_at=now - 1)
        kept = _record("kept", 2.0, expires_at=now + 3600)
        for record in (expired, kept, _record("forever", 3.0)):
            await store.commit(record, overwrite=False)
        assert await store.find(expired.path) is None
        assert [r.path.name for r in await store.of_run("s:train:0")] == ["forever", "kept"]
        assert await store.expired(now) == [expired.path]
        # An expired name may be saved again; the expired files are returned for removal.
        assert await store.commit(_record("old", 4.0), overwrite=False) == expired.location
        await store.update(kept.path, expires_at=None)
        assert (await store.get(kept.path)).expires_at is None
        with pytest.raises(NotFound) as info:
            await store.update(checkpoint_path("s:train:0", "weights", "nope"), public=1)
        assert info.value.field == "checkpoint_id"

    run_with_store(db_url, body)


def test_publish_and_paging_newest_first(db_url: str) -> None:
    async def body(store: CheckpointStore) -> None:
        for i in range(5):
            await store.commit(
                _record(f"c{i}", float(i), kind="sampler_weights", model_id=f"s:train:{i % 2}"), overwrite=False
            )
        await store.update(checkpoint_path("s:train:1", "sampler_weights", "c3"), public=1)
        page, total = await store.page(limit=2, offset=1)
        assert total == 5 and [r.path.name for r in page] == ["c3", "c2"]
        view = page[0].to_json("tiny")
        assert view["public"] is True and view["checkpoint_type"] == "sampler" and view["base_model"] == "tiny"
        assert view["checkpoint_id"] == "sampler_weights/c3" and view["user_metadata"] == {"step": "c3"}
        assert "expires_at" not in view

    run_with_store(db_url, body)
