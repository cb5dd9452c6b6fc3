"""Each sampling session's completion queue: what `retrieve_futures` long-polls.

A sample future that finishes appends (request_id, finished|failed, payload size) to the queue of its target,
the (sampling session, clone) pair the SDK's poller names. Entries are numbered 1, 2, ... in the order they
commit: that number is the poller's cursor. A poll returns the entries after its cursor and drops the ones it
has seen (all but the last, which keeps the numbering going). Waiters of a target wake at once when one of its
futures finishes in this process; otherwise they re-read the queue, quickly at first, then less often: one
query per target and poll, however many futures are in flight.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Table, delete, func, insert, literal, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.caches import remember
from app.db.schema import sample_completions
from app.db.wakeups import Wakeups

CLONE_BLOCK = 1_000_000_000  # a SamplingClient clone numbers its seq_ids from clone_id * 1e9
MAX_COMPLETIONS_PER_POLL = 1000
TRIM_EVERY = 64  # a busy poller's seen entries are dropped once this many have piled up (an idle one's at once)


@dataclass(frozen=True)
class Target:
    sampling_session_id: str
    clone_id: int


def target_of(sampling_session_id: str, seq_id: int) -> Target:
    return Target(sampling_session_id, seq_id // CLONE_BLOCK)


@dataclass(frozen=True)
class Completion:
    cursor: int
    request_id: str
    state: str  # finished | failed
    payload_size: int | None

    def to_wire(self) -> dict[str, Any]:
        """A FutureCompletion as the SDK reads it."""
        body: dict[str, Any] = {"state": self.state, "request_id": self.request_id}
        if self.state == "finished":
            body["response_payload_uncompressed_size"] = self.payload_size
        return body


async def insert_numbered(conn: AsyncConnection, table: Table, number: str, key: dict[str, Any], **values: Any) -> int:
    """Insert a row of `key` numbered one past the highest number of that key (1 for the first); returns it.

    One INSERT ... SELECT: SQLite runs it under its write lock; on Postgres the transaction first takes an advisory
    lock on the key (held to its end), so concurrent inserts of one key wait for each other instead of racing for
    the same number (racing and retrying, 12 joins at once ran out of retries on a loaded machine). Two keys whose
    names hash alike merely wait for each other."""
    if conn.dialect.name == "postgresql":
        lock_name = f"{table.name}:" + ":".join(f"{v}" for v in key.values())
        await conn.execute(select(func.pg_advisory_xact_lock(func.hashtext(lock_name))))
    column = table.c[number]
    where = [table.c[k] == v for k, v in key.items()]
    row = {**key, **values}
    names = list(row)
    source = select(*[literal(row[n], table.c[n].type) for n in names], func.coalesce(func.max(column), 0) + 1).where(
        *where
    )
    result = await conn.execute(insert(table).from_select([*names, number], source).returning(column))
    return int(result.scalar_one())


class CompletionLog:
    def __init__(self, db: AsyncEngine, *, poll_interval_s: float = 1.0) -> None:
        self._db = db
        self._wakeups: Wakeups[Target] = Wakeups(poll_interval_s)
        self._tracked: dict[str, Target] = {}  # futures created here: request_id -> target, until they finish
        self._trimmed: dict[Target, int] = {}  # the cursor each queue was last trimmed at, here

    def track(self, request_id: str, target: Target) -> None:
        """Remember a future's target, so its finishing (`wake`) wakes that target's waiters here."""
        self._tracked[request_id] = target

    def wake(self, request_id: str) -> None:
        target = self._tracked.pop(request_id, None)
        if target is not None:
            self.wake_target(target)

    def wake_target(self, target: Target) -> None:
        self._wakeups.wake(target)

    @staticmethod
    async def append(
        conn: AsyncConnection, target: Target, request_id: str, state: str, payload_size: int | None
    ) -> None:
        """Add a finished future to its target's queue, inside the transaction that finishes it."""
        key = {"sampling_session_id": target.sampling_session_id, "clone_id": target.clone_id}
        await insert_numbered(
            conn, sample_completions, "cursor", key, request_id=request_id, state=state, payload_size=payload_size
        )

    async def read(self, target: Target, after: int) -> list[Completion]:
        table = sample_completions
        async with self._db.connect() as conn:
            rows = await conn.execute(
                select(table.c.cursor, table.c.request_id, table.c.state, table.c.payload_size)
                .where(
                    table.c.sampling_session_id == target.sampling_session_id,
                    table.c.clone_id == target.clone_id,
                    table.c.cursor > after,
                )
                .order_by(table.c.cursor)
                .limit(MAX_COMPLETIONS_PER_POLL)
            )
            return [Completion(r.cursor, r.request_id, r.state, r.payload_size) for r in rows]

    async def trim(self, target: Target, seen: int, *, idle: bool = True) -> None:
        """Drop the entries before cursor `seen` (the poller has them); the one at `seen` keeps the numbering.
        While the poller is busy (`idle` False) only every TRIM_EVERY entries, to spare the database a write per
        poll."""
        if seen - self._trimmed.get(target, 0) < (1 if idle else TRIM_EVERY):
            return
        remember(self._trimmed, target, seen, limit=10_000)  # one per sampling session and clone polled here
        table = sample_completions
        async with self._db.begin() as conn:
            await conn.execute(
                delete(table).where(
                    table.c.sampling_session_id == target.sampling_session_id,
                    table.c.clone_id == target.clone_id,
                    table.c.cursor < seen,
                )
            )

    async def wait(self, target: Target, after: int, timeout_s: float) -> list[Completion]:
        """Long-poll: the entries after cursor `after` once there are any, or [] after `timeout_s`."""
        return await self._wakeups.poll(target, lambda: self.read(target, after), bool, timeout_s)
