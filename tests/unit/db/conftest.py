"""Every store test runs on both backends: a SQLite file, and a fresh database on the session's PostgreSQL server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import sqlite_url
from tests.postgres import PostgresServer


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of an empty database of its own for this test (no tables yet)."""
    if request.param == "sqlite":
        yield sqlite_url(tmp_path / "db.sqlite")
        return
    server: PostgresServer = request.getfixturevalue("postgres")
    name = server.create_database()
    try:
        yield server.url(name)
    finally:
        server.drop_database(name)
