"""GroupCommit on SQLite and PostgreSQL: concurrent writes share a transaction, a failing write fails alone, a
cancelled caller strands nobody, and the registry keeps no engine alive."""

from __future__ import annotations

import asyncio
import gc
import weakref
from pathlib import Path

import pytest
from sqlalchemy import event, insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.db.futures import Completed, FutureStore
from app.db.group_commit import GroupCommit, Write, group_commit
from app.db.schema import connect, schema_info
from tests.conftest import run_on_db, sqlite_url


def _insert(version: int) -> Write[int]:
    async def write(conn: AsyncConnection) -> int:
        await conn.execute(insert(schema_info).values(version=version))
        return version

    return write


async def _versions(db: AsyncEngine) -> list[int]:
    """The versions these tests wrote (the migration wrote one below 100)."""
    async with db.connect() as conn:
        return sorted((await conn.execute(select(schema_info.c.version).where(schema_info.c.version >= 100))).scalars())


def _count_commits(db: AsyncEngine) -> list[int]:
    commits: list[int] = []
    event.listen(db.sync_engine, "commit", lambda _conn: commits.append(1))
    return commits


def test_concurrent_writes_share_transactions(db_url: str) -> None:
    async def body(db: AsyncEngine) -> None:
        commits = _count_commits(db)
        writes = GroupCommit(db)
        assert await asyncio.gather(*(writes.run(_insert(v)) for v in range(100, 108))) == list(range(100, 108))
        assert await _versions(db) == list(range(100, 108))
        assert len(commits) == 1  # every write was queued before the first transaction began
        assert await writes.run(_insert(200)) == 200
        assert len(commits) == 2

    run_on_db(db_url, body)


def test_a_failing_write_fails_alone(db_url: str) -> None:
    async def body(db: AsyncEngine) -> None:
        writes = GroupCommit(db)
        await writes.run(_insert(300))
        outcomes = await asyncio.gather(
            writes.run(_insert(301)), writes.run(_insert(300)), writes.run(_insert(302)), return_exceptions=True
        )
        assert outcomes[0] == 301 and outcomes[2] == 302
        assert isinstance(outcomes[1], IntegrityError)  # the duplicate, and only it
        assert await _versions(db) == [300, 301, 302]

    run_on_db(db_url, body)


def test_a_cancelled_caller_strands_nobody(db_url: str) -> None:
    async def body(db: AsyncEngine) -> None:
        writes = GroupCommit(db)
        first = asyncio.ensure_future(writes.run(_insert(400)))
        second = asyncio.ensure_future(writes.run(_insert(401)))
        await asyncio.sleep(0)
        first.cancel()
        assert await asyncio.wait_for(second, timeout=10) == 401
        with pytest.raises(asyncio.CancelledError):
            await first
        assert await _versions(db) == [400, 401]  # the cancelled caller's write still ran

    run_on_db(db_url, body)


def test_stores_share_one_group_commit_per_engine(db_url: str) -> None:
    async def body(db: AsyncEngine) -> None:
        commits = _count_commits(db)
        assert group_commit(db) is group_commit(db)
        store = FutureStore(db)
        ids = [request_id for request_id, _ in await asyncio.gather(*(store.create("sample") for _ in range(6)))]
        before = len(commits)
        await asyncio.gather(*(store.complete(request_id, b"x", "application/x-protobuf") for request_id in ids))
        assert len(commits) - before == 1
        for request_id in ids:
            assert isinstance(await store.get(request_id), Completed)

    run_on_db(db_url, body)


def test_the_registry_lets_engines_go(tmp_path: Path) -> None:
    db = connect(sqlite_url(tmp_path / "gone.sqlite"))
    group_commit(db)
    gone = weakref.ref(db)
    del db
    gc.collect()
    assert gone() is None
