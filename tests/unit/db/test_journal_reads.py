"""JournalStore's reads for the hand-over sweep, on both backends: the ids of pending operations (no operation
decoded), then only the operations asked for."""

from __future__ import annotations

import time

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import journal_codec
from app.db.futures import FutureStore
from app.db.journal import JournalStore
from app.messages import AdamParams
from app.operations.optim_step import OptimStep
from tests.conftest import run_on_db


def test_pending_ids_then_only_the_ops_asked_for(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    decoded: list[bytes] = []
    decode = journal_codec.decode
    monkeypatch.setattr(journal_codec, "decode", lambda blob: decoded.append(blob) or decode(blob))

    async def body(db: AsyncEngine) -> None:
        futures, journal = FutureStore(db), JournalStore(db)
        steps = {}
        for model_id, seq_id in [("a", 1), ("a", 2), ("a", 3), ("b", 1)]:
            request_id, _ = await futures.create("optim_step", model_id, seq_id)
            steps[model_id, seq_id] = OptimStep(request_id, AdamParams(learning_rate=float(seq_id)))
            await journal.append(model_id, seq_id, steps[model_id, seq_id])
        await futures.complete(steps["a", 2].request_id, b"{}", "application/json")
        assert await journal.pending_since(time.time()) == [("a", 1), ("a", 3), ("b", 1)]
        assert await journal.pending_since(time.time() - 3600) == []  # none pending that long
        assert not decoded
        assert await journal.ops("a", [3]) == {3: steps["a", 3]}
        assert len(decoded) == 1

    run_on_db(db_url, body)
