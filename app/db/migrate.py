"""Bring the metadata database to the schema this release needs, at every start of every replica: Alembic applies
the revisions in app/db/migrations/versions that the database has not had, in one transaction.

Replicas that start together take turns: on PostgreSQL a transaction-level advisory lock, on SQLite an exclusive
lock on a file beside the database (every process that opens a SQLite file runs on its machine). The second one
finds the database at head and changes nothing."""

from __future__ import annotations

import asyncio
import fcntl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import IO

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

_MIGRATIONS = Path(__file__).with_name("migrations")
_PG_LOCK_KEY = 0x74696E6B  # "tink": the advisory lock every replica migrating a PostgreSQL database takes


class SchemaMismatch(RuntimeError):
    """The database was made by a tinker-serve version this one cannot open."""


def _config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS))
    return config


def head_revision() -> str:
    """The revision this release's schema is at."""
    head = ScriptDirectory.from_config(_config()).get_current_head()
    assert head is not None, "app/db/migrations/versions has no revisions"
    return head


async def migrate(db: AsyncEngine, revision: str = "head") -> None:
    """Apply every revision up to `revision` the database lacks; a database at a revision this release does not
    know (a newer tinker-serve made it) is refused with a message that says what to do."""
    async with _lock_beside(db), db.begin() as conn:
        if db.dialect.name == "postgresql":
            await conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK_KEY})
        await conn.run_sync(_upgrade, revision, db.url.render_as_string(hide_password=True))


def _upgrade(conn: Connection, revision: str, where: str) -> None:
    config = _config()
    current = MigrationContext.configure(conn).get_current_revision()
    known = {script.revision for script in ScriptDirectory.from_config(config).walk_revisions()}
    if current is not None and current not in known:
        raise SchemaMismatch(
            f"the state database {where} is at schema revision {current}, which this tinker-serve does not know "
            f"(it needs {head_revision()}): a newer release made it; use that release, or start with a fresh "
            "state_dir (or database_url)"
        )
    config.attributes["connection"] = conn
    command.upgrade(config, revision)


@asynccontextmanager
async def _lock_beside(db: AsyncEngine) -> AsyncIterator[None]:
    """An exclusive lock on `<database file>.migrate.lock` for a SQLite database; nothing for a server database."""
    if db.dialect.name != "sqlite" or not db.url.database:
        yield
        return
    lock_file = await asyncio.to_thread(_locked, Path(db.url.database + ".migrate.lock"))
    try:
        yield
    finally:
        lock_file.close()  # releases the lock


def _locked(path: Path) -> IO[str]:
    """`path` opened and locked exclusively (waits for the holder)."""
    lock_file = path.open("a")
    fcntl.flock(lock_file, fcntl.LOCK_EX)
    return lock_file
