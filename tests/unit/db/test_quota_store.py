"""QuotaStore on both backends: a user's live models, live checkpoint bytes and pending training operations (with
their journal rows' bytes) count only their own sessions' (not another user's, nor sessions made before owners were
recorded)."""

from __future__ import annotations

import time

from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.checkpoints import CheckpointRecord, CheckpointStore
from app.db.futures import FutureStore
from app.db.journal import JournalStore
from app.db.metadata import MetadataStore, TrainingRun
from app.db.quotas import QuotaStore
from app.messages import Skip
from app.storage.paths import CheckpointPath
from tests.conftest import run_on_db


def test_counts_are_per_owner(db_url: str) -> None:
    async def body(db: AsyncEngine) -> None:
        meta, checkpoints, futures, quotas = MetadataStore(db), CheckpointStore(db), FutureStore(db), QuotaStore(db)
        journal = JournalStore(db)
        now = time.time()
        sessions = {
            "alice": await meta.create_session(None, [], {}, owner="alice"),
            "bob": await meta.create_session(None, [], {}, owner="bob"),
            None: await meta.create_session(None, [], {}),
        }
        for owner, session in sessions.items():
            for i in range(3 if owner == "alice" else 1):
                model_id = f"{session}:train:{i}"
                await meta.add_training_run(
                    TrainingRun(model_id, session, "tiny", 4, "policy", "tiny", {}, {}, now, unloaded=False)
                )
                await checkpoints.commit(
                    CheckpointRecord(CheckpointPath(model_id, "weights", "c"), model_id, 100, now), False
                )
                await futures.create("optim_step", model_id, 1)
        alice_0 = f"{sessions['alice']}:train:0"
        await meta.mark_unloaded(alice_0)
        request_id, _ = await futures.create("optim_step", alice_0, 2)
        await futures.complete(request_id, b"{}", "application/json")
        expired = CheckpointRecord(CheckpointPath(alice_0, "weights", "old"), "x", 1000, now, expires_at=now - 1)
        await checkpoints.commit(expired, False)

        assert await quotas.live_models("alice") == 2
        assert await quotas.live_models("alice", besides=f"{sessions['alice']}:train:1") == 1
        assert await quotas.checkpoint_bytes("alice") == 300 and await quotas.checkpoint_bytes("bob") == 100
        assert await quotas.pending("alice") == (3, 0) and await quotas.pending("bob") == (1, 0)
        await journal.append(alice_0, 3, Skip((await futures.create("optim_step", alice_0, 3))[0]))
        count, held = await quotas.pending("alice")
        assert count == 4 and held > 0  # the journal row's bytes
        assert await quotas.live_models("carol") == 0 and await quotas.checkpoint_bytes("carol") == 0

    run_on_db(db_url, body)
