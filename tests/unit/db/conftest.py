"""Every store test runs on both backends: a SQLite file, and a fresh database on the session's PostgreSQL server."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import sqlite_url
from tests.postgres import PostgresServer


@pytest.fixture(params=["sqlite", "postgres"])
def new_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], str]]:
    """Makes the URL of a new empty database (no tables yet) on this test's backend at each call."""
    made: list[str] = []
    server: PostgresServer | None = request.getfixturevalue("postgres") if request.param == "postgres" else None

    def new() -> str:
        if server is None:
            made.append(str(len(made)))
            return sqlite_url(tmp_path / f"db-{made[-1]}.sqlite")
        made.append(server.create_database())
        return server.url(made[-1])

    yield new
    if server is not None:
        for name in made:
            server.drop_database(name)


@pytest.fixture
def db_url(new_db_url: Callable[[], str]) -> str:
    """The URL of an empty database of this test's own."""
    return new_db_url()
