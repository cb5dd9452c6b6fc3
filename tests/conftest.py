"""Shared test set-up: the repo root on sys.path, offline Hugging Face, the embedded tiny model path."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from deployments import serve_env  # noqa: E402
from tests.postgres import PostgresServer, PostgresUnavailable, free_port, postgres_server  # noqa: E402 (sets $PGPASSWORD)

# As `make serve` runs Serve, in every Ray the tests start: the shared app's Ingress replica answers on this port
# itself (direct ingress). Kept in the environment, which Ray's processes inherit, and which test modules imported
# under another module name than pytest's read the same port from. A port the shell already pins wins (apply only
# fills what is unset), so the port in effect is read back.
serve_env.apply(int(os.environ.setdefault("TINKER_SERVE_TEST_API_PORT", str(free_port()))))
API_PORT = serve_env.direct_port()

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TINKER_TELEMETRY", "0")
# Ray's own servers (GCS, raylets, object managers, agents) bind to 127.0.0.1 instead of this machine's address:
# Ray takes its node address from loopback when this is off, as on a laptop. Every test node is on this machine.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

TINY_MODEL = ROOT / "models" / "tiny"

T = TypeVar("T")


def sqlite_url(path: Path) -> str:
    return "sqlite+aiosqlite:///" + str(path)


def run_on_db(where: Path | str, body: Callable[..., Awaitable[T]], revision: str = "head") -> T:
    """Run `body(db)` against a real database with every table created (the stores' unit tests): a SQLite file at
    `where` when it is a path, else the database at the URL `where` (e.g. the `db_url` fixture's Postgres).
    `revision`: the schema revision it is brought to first (an earlier one: a database as an older release left it)."""
    from app.db.migrate import migrate
    from app.db.schema import connect

    async def main() -> T:
        db = connect(sqlite_url(where) if isinstance(where, Path) else where)
        try:
            await migrate(db, revision)
            return await body(db)
        finally:
            await db.dispose()

    return asyncio.run(main())


def run_sql(url: str, *statements: str) -> list[tuple]:
    """Run raw SQL `statements` in one transaction on the database at `url`; the rows of the last one."""
    from sqlalchemy import text

    from app.db.schema import connect

    async def main() -> list[tuple]:
        db = connect(url)
        try:
            async with db.begin() as conn:
                rows: list[tuple] = []
                for statement in statements:
                    result = await conn.execute(text(statement))
                    rows = [tuple(row) for row in result] if result.returns_rows else []
                return rows
        finally:
            await db.dispose()

    return asyncio.run(main())


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server of this test session's own (tests/postgres.py); it fails, not skips, when none starts."""
    try:
        with postgres_server() as server:
            yield server
    except PostgresUnavailable as exc:
        pytest.fail(f"PostgreSQL tests cannot run: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def presets_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the session's embedded presets are built, each once: `build_embedded_model(preset, presets_dir /
    preset)` is a no-op after the first (the family tests of the trainer, the sampler and sequence parallelism share
    them; ~1.3 s a build on 2 cores)."""
    return tmp_path_factory.mktemp("presets")


def pytest_unconfigure() -> None:
    """Stop the `tinker` SDK's event-loop thread before the interpreter finalizes.

    The SDK runs every client's heartbeat, futures pollers and connection pools on one daemon thread for the life of
    the process. A test's client left open keeps that thread at work; one whose server had gone (a module's own app)
    retried its heartbeat to the end of a clean-clone run, logged into pytest's closed capture file while the
    interpreter was exiting, and the process then died of a segmentation fault after every test had passed.
    """
    holder = sys.modules.get("tinker.lib.internal_client_holder")
    if holder is None:  # no test imported the SDK (e.g. `make quick`)
        return
    sdk_thread = holder._internal_client_holder_thread_singleton
    loop = sdk_thread.loop_if_started()
    if loop is None:
        return

    async def cancel_the_rest() -> None:
        tasks = asyncio.all_tasks() - {asyncio.current_task()}
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run_coroutine_threadsafe(cancel_the_rest(), loop).result(timeout=30)
    loop.call_soon_threadsafe(loop.stop)
    sdk_thread._thread.join(timeout=30)
