"""JournalStore on SQLite and PostgreSQL: operations come back in order with their futures' states; snapshots keep
the newest two and prune the journal the older one covers (never the creation); forgetting drops everything."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.futures import JSON_CONTENT_TYPE, FutureStore
from app.db.journal import JournalStore
from app.messages import AdamParams, AdapterSpec, Skip
from app.operations.create_model import CreateModel
from app.operations.optim_step import OptimStep
from tests.conftest import run_on_db


def test_journal_snapshots_and_pruning(db_url: str) -> None:
    async def body(db: AsyncEngine) -> None:
        futures, journal = FutureStore(db), JournalStore(db)
        ids = [(await futures.create("op", "m", seq))[0] for seq in range(6)]
        await journal.append("m", 0, CreateModel(ids[0], AdapterSpec(rank=4, seed=1)))
        for seq in range(1, 6):
            await journal.append("m", seq, OptimStep(ids[seq], AdamParams(learning_rate=seq)))
        await journal.append("m", 3, Skip(ids[3]))  # a retried append keeps the first
        await futures.complete(ids[0], b"{}", JSON_CONTENT_TYPE)
        await futures.complete(ids[1], b"{}", JSON_CONTENT_TYPE)
        await futures.fail(ids[2], {"message": "no"})

        entries = await journal.entries("m")
        assert [(e.seq_id, e.state) for e in entries] == [
            (0, "completed"),
            (1, "completed"),
            (2, "failed"),
            (3, "pending"),
            (4, "pending"),
            (5, "pending"),
        ]
        assert entries[0].op == CreateModel(ids[0], AdapterSpec(rank=4, seed=1))
        assert entries[3].op == OptimStep(ids[3], AdamParams(learning_rate=3))

        assert await journal.record_snapshot("m", 2, "m/snapshots/2") == []
        assert [e.seq_id for e in await journal.entries("m")] == [0, 1, 2, 3, 4, 5]  # the newest may be unfinished
        assert await journal.record_snapshot("m", 4, "m/snapshots/4") == []
        assert [e.seq_id for e in await journal.entries("m")] == [0, 3, 4, 5]  # snapshot 2 is whole now
        assert await journal.record_snapshot("m", 5, "m/snapshots/5") == ["m/snapshots/2"]
        newest, older = await journal.snapshots_of("m")
        assert (newest.seq_id, newest.location, older.seq_id, older.location) == (
            5,
            "m/snapshots/5",
            4,
            "m/snapshots/4",
        )
        assert newest.created_at >= older.created_at > 0
        assert [e.seq_id for e in await journal.entries("m")] == [0, 5]

        await journal.append("other", 0, Skip("x"))
        assert sorted(await journal.forget("m")) == ["m/snapshots/4", "m/snapshots/5"]
        assert await journal.entries("m") == [] and await journal.snapshots_of("m") == []
        assert [e.state for e in await journal.entries("other")] == ["failed"]  # no future: never ran

    run_on_db(db_url, body)


def test_worker_deaths_are_counted_per_operation(db_url: str) -> None:
    """Each charge counts once against each operation named (in its journal row, where a new trainer reads it);
    unknown ids are left out, and entries report the count."""

    async def body(db: AsyncEngine) -> None:
        futures, journal = FutureStore(db), JournalStore(db)
        ids = [(await futures.create("op", "m", seq))[0] for seq in range(3)]
        await journal.append("m", 0, CreateModel(ids[0], AdapterSpec(rank=4, seed=1)))
        for seq in (1, 2):
            await journal.append("m", seq, OptimStep(ids[seq], AdamParams(learning_rate=seq)))
        assert await journal.charge_worker_death([]) == {}
        assert await journal.charge_worker_death([ids[1], ids[2], "unknown"]) == {ids[1]: 1, ids[2]: 1}
        assert await journal.charge_worker_death([ids[1]]) == {ids[1]: 2}
        assert [(e.seq_id, e.worker_deaths) for e in await journal.entries("m")] == [(0, 0), (1, 2), (2, 1)]

    run_on_db(db_url, body)
