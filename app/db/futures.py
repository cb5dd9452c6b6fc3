"""The future store: every long operation is a row; outcomes are a closed union (app.db.outcomes).

Rows live in the database so any ingress replica can answer `retrieve_future` and a restart loses no
finished result. Waiters in the process that completes a future wake at once; others poll the row,
quickly at first and then less often (many concurrent long-polls must not load the database). A sample
future that finishes also joins its sampling session's completion queue (`completions`), in the same
transaction. What a process finished, or was handed in a Trainer's or Sampler's reply, stays in memory a short
while (`recent`), so the long-poll that follows needs no read of the row.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from sqlalchemy import Row, delete, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.caches import remember
from app.db.completions import CompletionLog, target_of
from app.db.group_commit import group_commit
from app.db.outcomes import Completed, Failed, Outcome, Pending, RecentOutcomes, Unknown, Written
from app.db.schema import futures, journal, session_requests
from app.db.wakeups import Wakeups
from app.errors import NotFound


def _samples(rows: Sequence[Row]) -> list[Row]:
    return [row for row in rows if row.kind == "sample" and row.subject_id is not None and row.seq_id is not None]


def future_not_found(request_id: str) -> NotFound:
    """What a future that does not exist, or is another user's, answers."""
    return NotFound(f"unknown request_id {request_id!r}", field="request_id")


PROTO_CONTENT_TYPE = "application/x-protobuf"
JSON_CONTENT_TYPE = "application/json"


class FutureStore:
    def __init__(self, db: AsyncEngine, *, poll_interval_s: float = 1.0) -> None:
        self._db = db
        self._writes = group_commit(db)  # samples that finish together complete in one transaction
        self._wakeups: Wakeups[str] = Wakeups(poll_interval_s)
        self.completions = CompletionLog(db, poll_interval_s=poll_interval_s)
        self._sessions: dict[str, str] = {}  # request id -> its session: futures made or looked up here
        self.recent = RecentOutcomes()  # what this process finished, or was handed in a reply (app.db.outcomes)

    async def create(self, kind: str, subject_id: str | None = None, seq_id: int | None = None) -> tuple[str, bool]:
        """A new pending future of `subject_id` (the model, sampling session or custom loss it belongs to); for a
        repeated (subject_id, seq_id) the existing id and False."""
        request_id = uuid.uuid4().hex
        row = {
            "request_id": request_id,
            "kind": kind,
            "subject_id": subject_id,
            "seq_id": seq_id,
            "state": "pending",
            "created_at": time.time(),
        }

        async def write(conn: AsyncConnection) -> None:
            await conn.execute(insert(futures).values(**row))
            if subject_id is not None:  # every model, sampler and custom loss id starts with its session's id
                await conn.execute(
                    insert(session_requests).values(
                        request_id=request_id, session_id=_session_of(subject_id), created_at=row["created_at"]
                    )
                )

        try:
            await self._writes.run(write)
            if subject_id is not None:  # its client polls it next: the ownership check needs no read
                remember(self._sessions, request_id, _session_of(subject_id))
            if kind == "sample" and subject_id is not None and seq_id is not None:
                self.completions.track(request_id, target_of(subject_id, seq_id))
            return request_id, True
        except IntegrityError:
            if seq_id is None:
                raise
            async with self._db.connect() as conn:
                existing = (
                    await conn.execute(
                        select(futures.c.request_id).where(
                            futures.c.subject_id == subject_id, futures.c.seq_id == seq_id
                        )
                    )
                ).scalar_one()
            return existing, False

    async def complete(self, request_id: str, payload: bytes, content_type: str) -> None:
        await self._finish(Completed(request_id, payload, content_type))

    async def fail(self, request_id: str, error: dict) -> None:
        await self._finish(Failed(request_id, error))

    async def fail_if_pending(self, request_id: str, error: dict) -> None:
        """Fail a future unless something already finished it (used when a dispatch itself breaks)."""
        if isinstance(await self.get(request_id), Pending):
            await self.fail(request_id, error)

    async def cancel(self, request_id: str, error: dict) -> Row | None:
        """Fail a pending future with `error` (its work's result will be discarded); its (request_id, kind,
        subject_id, seq_id), or None when it is unknown or already finished."""
        return await self._finish(Failed(request_id, error))

    async def _finish(self, outcome: Written) -> Row | None:
        """Finish the future if it is pending; what it now holds is kept in `recent` (the Trainer or Sampler that
        wrote it returns it from there in its reply), then its waiters here wake."""
        values: dict[str, Any] = (
            {"state": "completed", "payload": outcome.payload, "content_type": outcome.content_type}
            if isinstance(outcome, Completed)
            else {"state": "failed", "error": outcome.error}
        )
        rows = await self._finish_where(values, futures.c.request_id == outcome.request_id)
        if rows:  # it was pending: the row is final now, as kept
            self.recent.put(replace(outcome, kind=rows[0].kind) if isinstance(outcome, Completed) else outcome)
        self.notify(outcome.request_id)
        return rows[0] if rows else None

    async def fail_stale(self, kind: str, created_before: float, error: dict) -> int:
        """Fail every pending future of `kind` created before `created_before`; returns how many."""
        failed = {"state": "failed", "error": error}
        return len(await self._finish_where(failed, futures.c.kind == kind, futures.c.created_at < created_before))

    async def _finish_where(self, values: dict[str, Any], *conditions: Any) -> Sequence[Row]:
        """Finish every pending future matching `conditions` with `values` in one transaction, putting the samples
        among them in their sampling sessions' completion queues, then wake those queues' waiters here. Returns
        the (request_id, kind, subject_id, seq_id) of each."""
        payload = values.get("payload")
        state = "finished" if values["state"] == "completed" else "failed"
        statement = (
            update(futures)
            .where(futures.c.state == "pending", *conditions)
            .values(completed_at=time.time(), **values)
            .returning(futures.c.request_id, futures.c.kind, futures.c.subject_id, futures.c.seq_id)
        )

        async def write(conn: AsyncConnection) -> Sequence[Row]:
            rows = (await conn.execute(statement)).all()
            for row in _samples(rows):
                target = target_of(row.subject_id, row.seq_id)
                size = len(payload) if isinstance(payload, bytes) else None
                await self.completions.append(conn, target, row.request_id, state, size)
            return rows

        rows = await self._writes.run(write)
        for row in _samples(rows):
            self.completions.wake_target(target_of(row.subject_id, row.seq_id))
        return rows

    async def expire_finished(self, before: float, batch: int = 10_000) -> int:
        """Remove the futures (and their results) finished before `before`, but not those a model's journal still
        replays (app.db.journal reads a missing future as failed); returns how many."""
        old = (
            select(futures.c.request_id)
            .where(futures.c.state != "pending", futures.c.completed_at < before)
            .where(~select(journal.c.request_id).where(journal.c.request_id == futures.c.request_id).exists())
            .limit(batch)
        )
        removed = 0
        while True:
            async with self._db.begin() as conn:
                ids = list((await conn.execute(old)).scalars())
                await conn.execute(delete(session_requests).where(session_requests.c.request_id.in_(ids)))
                await conn.execute(delete(futures).where(futures.c.request_id.in_(ids)))
            removed += len(ids)
            if len(ids) < batch:
                return removed

    def notify(self, request_id: str) -> None:
        """Wake local waiters of a future finished by this or another process."""
        self._wakeups.wake(request_id)
        self.completions.wake(request_id)

    async def session_of(self, request_id: str) -> str | None:
        """The session a future belongs to (None: no such future). Every future's subject_id is a model, sampling
        session or custom loss id, and those start with their session id and a colon."""
        session_id = self._sessions.get(request_id)
        if session_id is not None:
            return session_id
        async with self._db.connect() as conn:
            subject_id = await conn.scalar(select(futures.c.subject_id).where(futures.c.request_id == request_id))
        return None if subject_id is None else remember(self._sessions, request_id, _session_of(str(subject_id)))

    async def get(self, request_id: str) -> Outcome:
        async with self._db.connect() as conn:
            row = (
                await conn.execute(
                    select(
                        futures.c.state, futures.c.payload, futures.c.content_type, futures.c.error, futures.c.kind
                    ).where(futures.c.request_id == request_id)
                )
            ).first()
        if row is None:
            return Unknown(request_id)
        if row.state == "completed":
            return Completed(request_id, row.payload, row.content_type, row.kind)
        if row.state == "failed":
            return Failed(request_id, row.error)
        return Pending(request_id)

    async def wait(self, request_id: str, timeout_s: float) -> Outcome:
        """Long-poll: the outcome once finished, or Pending after `timeout_s`. An outcome kept in `recent` is
        answered (once) without reading the row, to whoever asks: check that the caller may read it first."""
        return await self._wakeups.poll(
            request_id, lambda: self._read(request_id), lambda outcome: not isinstance(outcome, Pending), timeout_s
        )

    async def _read(self, request_id: str) -> Outcome:
        kept = self.recent.take(request_id)
        return kept if kept is not None else await self.get(request_id)


def _session_of(subject_id: str) -> str:
    """Every model, sampling session and custom loss id starts with its session's id and a colon."""
    return subject_id.split(":", 1)[0]
