"""Migrations (app/db/migrate.py, Alembic): a fresh database gets exactly app.db.schema's tables; databases made
before Alembic (schema_info versions 2-5) upgrade in place keeping their rows; replicas migrating together all start;
a database this release cannot open is refused with what to do."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.metadata import MetadataStore, TrainingRun
from app.db.migrate import SchemaMismatch, head_revision, migrate
from app.db.schema import connect, metadata
from tests.conftest import run_on_db, run_sql

_V2_TRAINING_RUNS = """CREATE TABLE training_runs (
    model_id VARCHAR(200) PRIMARY KEY, session_id VARCHAR(64) NOT NULL, base_model VARCHAR(200) NOT NULL,
    lora_rank INTEGER NOT NULL, role VARCHAR(16) NOT NULL, trainer VARCHAR(220) NOT NULL, lora_config JSON NOT NULL,
    user_metadata JSON, created_at FLOAT NOT NULL, last_seq_id INTEGER NOT NULL, unloaded INTEGER NOT NULL)"""
_V2_SESSIONS = """CREATE TABLE sessions (
    session_id VARCHAR(64) PRIMARY KEY, created_at FLOAT NOT NULL, last_heartbeat FLOAT NOT NULL,
    finished_reason VARCHAR(32), sdk_version VARCHAR(32), tags JSON, user_metadata JSON)"""


def _run(model_id: str) -> TrainingRun:
    return TrainingRun(
        model_id=model_id,
        session_id="s",
        base_model="b",
        lora_rank=4,
        role="policy",
        trainer="b",
        lora_config={"rank": 4, "seed": 1},
        user_metadata={},
        created_at=1.0,
        unloaded=False,
    )


async def _columns(db: AsyncEngine, table: str) -> list[str]:
    async with db.connect() as conn:
        return await conn.run_sync(lambda sync: [c["name"] for c in inspect(sync).get_columns(table)])


def _version_2_database(url: str) -> None:
    _last_release_before_alembic(url)  # its tables, then training_runs and the version as of 2
    run_sql(
        url,
        "DROP TABLE training_runs",
        _V2_TRAINING_RUNS,
        "DROP TABLE sessions",
        _V2_SESSIONS,
        "DROP INDEX ix_futures_state_model",  # added with schema 5
        "INSERT INTO sessions VALUES ('s', 1.0, 1.0, NULL, '0.25', '[]', '{}')",
        "INSERT INTO training_runs VALUES ('s:train:0', 's', 'b', 4, 'policy', 'b', '{}', '{}', 1.0, 7, 0)",
        "UPDATE schema_info SET version = 2",
    )


def _last_release_before_alembic(url: str) -> None:
    """A database as the last release before Alembic left it: revision 0001's tables, schema_info version 5."""

    run_on_db(url, lambda db: asyncio.sleep(0), revision="0001")
    run_sql(url, "DROP TABLE alembic_version", "UPDATE schema_info SET version = 5")


def _at_alembic_head(url: str) -> bool:
    return run_sql(url, "SELECT version_num FROM alembic_version") == [(head_revision(),)] and run_sql(
        url, "SELECT version FROM schema_info"
    ) == [(6,)]


def test_a_fresh_database_gets_exactly_the_tables_the_code_declares(db_url: str) -> None:
    """Every change to app/db/schema.py needs a revision: the migrated database and the declared tables agree."""

    async def differences(db: AsyncEngine) -> list:
        async with db.connect() as conn:
            return await conn.run_sync(lambda sync: compare_metadata(MigrationContext.configure(sync), metadata))

    assert run_on_db(db_url, differences) == []
    assert _at_alembic_head(db_url)


def test_version_2_upgrades_in_place_to_the_current_version(db_url: str) -> None:
    _version_2_database(db_url)

    async def body(db: AsyncEngine) -> list[str]:
        store = MetadataStore(db)
        await store.add_training_run(_run("s:train:1"))  # fails while last_seq_id (NOT NULL) is still there
        assert (await store.get_training_run("s:train:0")).base_model == "b"
        assert await store.owner_of("s") is None  # made before owners: everyone's (app.db.owners)
        assert await store.owner_of(await store.create_session("0.38", [], {}, owner="user-a")) == "user-a"
        return await _columns(db, "training_runs")

    columns = run_on_db(db_url, body)
    run_on_db(db_url, lambda db: asyncio.sleep(0))  # reopening an upgraded database is fine
    assert "last_seq_id" not in columns and "unloaded" in columns
    assert _at_alembic_head(db_url)
    assert run_sql(db_url, "SELECT count(*) FROM stability_records") == [(0,)]
    assert run_sql(db_url, "SELECT count(*) FROM training_runs") == [(2,)]


def test_futures_keep_their_subject_across_the_rename(db_url: str) -> None:
    """Revision 0006 renames futures.model_id to subject_id: a pending future made before it is still found by its
    (subject, seq_id), and a retry of it still finds it."""

    run_on_db(db_url, lambda db: asyncio.sleep(0), revision="0005")
    run_sql(
        db_url,
        "INSERT INTO futures (request_id, kind, model_id, seq_id, state, created_at) "
        "VALUES ('r1', 'optim_step', 's:train:0', 3, 'pending', 1.0)",
    )

    async def body(db: AsyncEngine) -> tuple[str, bool]:
        from app.db.futures import FutureStore

        return await FutureStore(db).create("optim_step", "s:train:0", 3)

    assert run_on_db(db_url, body) == ("r1", False)
    assert run_sql(db_url, "SELECT subject_id, seq_id FROM futures") == [("s:train:0", 3)]


def test_replicas_creating_the_tables_together_all_start(new_db_url: Callable[[], str]) -> None:
    """Ingress, trainer and sampler replicas open a fresh database at once: one creates each table, and the
    others ("table ... already exists") look again instead of failing their replica."""

    async def together(url: str) -> None:
        dbs = [connect(url) for _ in range(4)]
        try:
            await asyncio.gather(*(migrate(db) for db in dbs))
        finally:
            for db in dbs:
                await db.dispose()

    for _ in range(8):
        url = new_db_url()
        asyncio.run(together(url))
        assert _at_alembic_head(url)


def test_the_last_release_before_alembic_is_adopted_as_it_is(db_url: str) -> None:
    _last_release_before_alembic(db_url)
    run_sql(
        db_url,
        "INSERT INTO sessions (session_id, created_at, last_heartbeat, owner) VALUES ('s', 1.0, 1.0, 'user-a')",
    )
    run_on_db(db_url, lambda db: asyncio.sleep(0))
    assert _at_alembic_head(db_url)
    assert run_sql(db_url, "SELECT owner FROM sessions") == [("user-a",)]


def test_a_database_this_release_cannot_open_is_refused(new_db_url: Callable[[], str]) -> None:
    old = new_db_url()
    run_sql(old, "CREATE TABLE futures (request_id VARCHAR(64) PRIMARY KEY)")  # what stops up to 9 made: no version
    with pytest.raises(SchemaMismatch, match="schema version 1, which no tinker-serve release upgrades"):
        run_on_db(old, lambda db: asyncio.sleep(0))
    newer = new_db_url()
    run_on_db(newer, lambda db: asyncio.sleep(0))
    run_sql(newer, "UPDATE alembic_version SET version_num = 'f00d'")  # as a later release would leave it
    with pytest.raises(SchemaMismatch, match="at schema revision f00d, which this tinker-serve does not know"):
        run_on_db(newer, lambda db: asyncio.sleep(0))
