"""The DB statement metric's labels (app/db/statement_metrics.py): each statement the stores send is named by its verb
and the table it works on, as both dialects compile it, so the label set stays as small as the schema."""

from __future__ import annotations

import pytest
from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql import ClauseElement

from app.db.schema import futures, journal, snapshots
from app.db.statement_metrics import statement_kind

STATEMENTS: list[tuple[ClauseElement, str]] = [
    (select(futures.c.state).where(futures.c.request_id == "r"), "select futures"),
    (
        select(journal.c.op, futures.c.state).join(futures, futures.c.request_id == journal.c.request_id),
        "select journal",
    ),
    (select(func.count()).select_from(select(snapshots.c.seq_id).subquery()), "select snapshots"),
    (insert(journal).values(model_id="m", seq_id=1), "insert journal"),
    (update(futures).where(futures.c.state == "pending").values(state="failed"), "update futures"),
    (delete(snapshots).where(snapshots.c.model_id == "m"), "delete snapshots"),
]


@pytest.mark.parametrize("dialect", [sqlite.dialect(), postgresql.dialect()], ids=["sqlite", "postgresql"])
@pytest.mark.parametrize(("statement", "kind"), STATEMENTS, ids=[kind for _, kind in STATEMENTS])
def test_statements_are_named_by_verb_and_table(statement: ClauseElement, kind: str, dialect: object) -> None:
    assert statement_kind(str(statement.compile(dialect=dialect))) == kind


def test_statements_naming_no_table_are_named_by_their_verb() -> None:
    assert statement_kind("PRAGMA journal_mode=WAL") == "pragma"
    assert statement_kind("SELECT pg_advisory_xact_lock($1)") == "select"
