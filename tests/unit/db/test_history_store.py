"""HistoryStore on SQLite and PostgreSQL: points come back in seq_id order and paged; a rerun is recorded once;
a run keeps at most its bound (the oldest go); the steps done survive for a rebuilt trainer to count on from."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.history import HistoryPoint, HistoryStore
from tests.conftest import run_on_db


def _point(seq_id: int) -> HistoryPoint:
    if seq_id % 2:
        return HistoryPoint(seq_id, "forward_backward", 1.0 + seq_id, seq_id // 2, 64, None, {"loss:sum": seq_id})
    return HistoryPoint(seq_id, "optim_step", 1.0 + seq_id, seq_id // 2, 0, 1e-3, {})


def test_history_pages_bounds_and_counts_steps(db_url: str) -> None:
    async def body(db: AsyncEngine) -> None:
        store = HistoryStore(db, max_points_per_run=50)
        assert await store.steps_done("m") == 0
        for seq_id in range(1, 129):
            await store.add("m", _point(seq_id))
        await store.add("m", _point(128))  # a rerun after a restart
        await store.add("other", _point(1))
        first = await store.page("m", -1, 10)
        assert [p.seq_id for p in first] == list(range(79, 89))  # trimmed at seq_id 128 to the newest 50
        assert first[0] == _point(79) and first[1].metrics == {}
        assert first[0].to_json()["metrics"] == {"loss:sum": 79}
        rest = await store.page("m", first[-1].seq_id, 1000)
        assert [p.seq_id for p in rest] == list(range(89, 129))
        assert await store.steps_done("m") == 64

    run_on_db(db_url, body)
