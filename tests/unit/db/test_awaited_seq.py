"""QuotaStore.awaited_seq on both backends: the seq_id a model's pending operations wait for is the first without a
future after the last completed before them (failed ones, rejected at the ingress or by the trainer, are passed
over); none when nothing is pending or the first pending one is next."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.futures import FutureStore
from app.db.quotas import QuotaStore
from tests.conftest import run_on_db


def test_the_awaited_seq_is_the_first_gap_after_the_last_completed(db_url: str) -> None:
    async def body(db: AsyncEngine) -> None:
        futures, quotas = FutureStore(db), QuotaStore(db)

        async def add(seq_id: int, state: str = "pending") -> None:
            request_id, _ = await futures.create("optim_step", "m", seq_id)
            if state == "completed":
                await futures.complete(request_id, b"{}", "application/json")
            elif state == "failed":
                await futures.fail(request_id, {"error": "e", "category": "user"})

        await add(0, "completed")  # the creation
        assert await quotas.awaited_seq("m") is None  # nothing pending
        await add(1000)
        await add(999)  # a count down: still 1 is awaited
        assert await quotas.awaited_seq("m") == 1
        await add(1)
        assert await quotas.awaited_seq("m") is None  # the first pending one is next
        await add(2)
        assert await quotas.awaited_seq("m") is None
        for seq_id in (1, 2):
            await futures.complete((await futures.create("optim_step", "m", seq_id))[0], b"{}", "application/json")
        await add(3, "failed")
        await add(5, "failed")
        await add(6)
        assert await quotas.awaited_seq("m") == 4  # past the failed 3, before the failed 5
        assert await quotas.awaited_seq("other") is None

    run_on_db(db_url, body)
