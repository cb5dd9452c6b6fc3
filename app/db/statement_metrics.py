"""Each process's database statements, counted by process and statement (verb and table): the
`tinker_serve_db_statements` metric, which says how many round trips to the database a workload costs."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from app.metrics import server_metrics

_TARGET = re.compile(r"^\s*(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+\"?(\w+)|\bFROM\s+\"?(\w+)", re.IGNORECASE)


@lru_cache(maxsize=1024)
def statement_kind(sql: str) -> str:
    """`verb table` of a statement (`select futures`, `insert journal`); the verb alone when no table is named."""
    verb = sql.split(None, 1)[0].lower() if sql.strip() else "-"
    target = _TARGET.search(sql)
    return f"{verb} {target.group(1) or target.group(2)}" if target else verb


def count_statements(db: AsyncEngine, process: str) -> None:
    """Count every statement `db` sends from now on under `process` (ingress, trainer, sampler)."""
    counter = server_metrics().db_statements

    @event.listens_for(db.sync_engine, "before_cursor_execute")
    def _count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        counter.inc(tags={"process": process, "statement": statement_kind(statement)})
