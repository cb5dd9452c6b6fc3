"""Rebuilding a lost model (app.trainer.recovery.rebuild) from its journal and snapshots, on a real engine, journal
and storage: a snapshot the kill interrupted is never the one restored; the rebuild falls back to the one before
it and replays the journal since, and the model equals the one that was lost, bit for bit."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Sequence
from pathlib import Path

import numpy as np
import torch
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.futures import JSON_CONTENT_TYPE, FutureStore
from app.db.journal import JournalStore
from app.messages import (
    AdamParams,
    AdapterSpec,
    CommandError,
    CreateModel,
    CreateModelCommand,
    ForwardBackwardArgs,
    Replies,
    SequencedOp,
    Skip,
    SnapshotCommand,
    WorkerCommand,
)
from app.operations import operation
from app.operations.forward_backward import ForwardBackward
from app.operations.optim_step import OptimStep
from app.ranks.execute import execute
from app.ranks.snapshots import SnapshotWriter
from app.storage.objects import ObjectStorage
from app.storage.paths import snapshot_location
from app.trainer.recovery import Takeover, rebuild, unfinished
from app.trainer.worker_group import WorkerGroup
from app.training.base_model import load_base_model
from app.training.engine import TrainingEngine
from app.training_data.batch import PackedBatch
from tests.conftest import TINY_MODEL, run_on_db

SPEC = AdapterSpec(rank=4, seed=7)


class InProcessGroup(WorkerGroup):
    """One rank running commands on an engine in this process, as a worker's command loop does."""

    def __init__(self, storage: ObjectStorage) -> None:
        self.engine = TrainingEngine(load_base_model(str(TINY_MODEL)))
        self._storage = storage
        self.snapshots = SnapshotWriter(storage)

    async def start(self) -> None: ...

    async def wait_ready(self) -> None: ...

    def send(self, commands: Sequence[WorkerCommand]) -> Awaitable[Replies]:
        async def run() -> Replies:
            return [[execute(self.engine, self._storage, self.snapshots, cmd) for cmd in commands]]

        return run()

    async def cancel(self, request_id: str) -> bool:
        return False

    def check_health(self) -> None: ...

    async def stop(self) -> None: ...

    @property
    def world_size(self) -> int:
        return 1


def _batch(seed: int) -> PackedBatch:
    rng = np.random.default_rng(seed)
    vocab = load_base_model(str(TINY_MODEL)).config.vocab_size
    return PackedBatch(
        tokens=rng.integers(3, vocab, 12, dtype=np.int64),
        offsets=np.array([0, 5, 12], dtype=np.int64),
        loss_inputs={"target_tokens": rng.integers(3, vocab, 12, dtype=np.int64)},
    )


def _by_layer(engine: TrainingEngine) -> dict[str, torch.Tensor]:
    """The model's trainable tensors, named without the engine's internal adapter name."""
    return {re.sub(r"\.m\d+\.", ".", name): t for name, t in engine.adapter_state("m").items()}


def test_an_interrupted_snapshot_is_never_restored_and_the_rebuild_is_exact(tmp_path: Path) -> None:
    storage = ObjectStorage(str(tmp_path / "store"))

    async def body(db: AsyncEngine) -> None:
        futures, journal = FutureStore(db), JournalStore(db)
        live = InProcessGroup(storage)

        async def accept(seq_id: int, op: CreateModel | SequencedOp) -> None:
            """What the ingress and the trainer do with an operation: journal it, run it, complete its future."""
            await journal.append("m", seq_id, op)
            command = (
                CreateModelCommand("m", op.spec) if isinstance(op, CreateModel) else operation(op).command("m", op)
            )
            (reply,) = (await live.call([command]))[0]
            assert not isinstance(reply, CommandError), reply
            await futures.complete(op.request_id, b"{}", JSON_CONTENT_TYPE)

        await accept(0, CreateModel((await futures.create("create", "m", 0))[0], SPEC))
        for seq_id in range(1, 9):
            request_id = (await futures.create("op", "m", seq_id))[0]
            if seq_id % 2:
                args = ForwardBackwardArgs("cross_entropy", {}, False, _batch(seq_id))
                await accept(seq_id, ForwardBackward(request_id, args))
            else:
                await accept(seq_id, OptimStep(request_id, AdamParams(learning_rate=1e-2)))
            if seq_id in (4, 8):
                location = snapshot_location("m", seq_id)
                if seq_id == 4:  # written whole
                    await live.call([SnapshotCommand("m", location)])
                    live.snapshots.flush()
                await journal.record_snapshot("m", seq_id, location)  # 8: the kill came before it was published
        assert [e.seq_id for e in await journal.entries("m")] == [0, 5, 6, 7, 8]  # snapshot 4 covers 1-4
        assert not (tmp_path / "store" / snapshot_location("m", 8)).exists()

        fresh = InProcessGroup(storage)
        assert await rebuild(fresh, journal, "m") == 4  # from snapshot 4: operations 5-8 replayed
        expected, got = _by_layer(live.engine), _by_layer(fresh.engine)  # (the first try made adapter m0, then m1)
        assert expected.keys() == got.keys()
        assert all(torch.equal(expected[k], got[k]) for k in expected)

    run_on_db(tmp_path / "meta.db", body)


def test_a_new_trainer_queues_what_never_finished_in_order(tmp_path: Path) -> None:
    """Pending operations rerun from the first of them; one the ingress rejected between them, or one that was running
    each time the workers died as often as allowed, only advances the order; a model whose creation never finished is
    created, and one without a journal is left to its create call."""

    async def body(db: AsyncEngine) -> None:
        futures, journal = FutureStore(db), JournalStore(db)
        ids = [(await futures.create("op", "m", seq))[0] for seq in range(5)]
        assert await unfinished(journal, "m", 2) is None  # not journaled yet: its create call is on its way
        await journal.append("m", 0, CreateModel(ids[0], SPEC))
        assert await unfinished(journal, "m", 2) == CreateModel(ids[0], SPEC)  # the creation is still pending
        ops = [OptimStep(ids[seq], AdamParams(learning_rate=seq)) for seq in range(5)]
        for seq in range(1, 5):
            await journal.append("m", seq, ops[seq])
        for seq in (0, 1):
            await futures.complete(ids[seq], b"{}", JSON_CONTENT_TYPE)
        await futures.fail(ids[3], {"message": "rejected at the ingress"})
        assert await unfinished(journal, "m", 2) == Takeover(2, [(2, ops[2]), (3, Skip(ids[3])), (4, ops[4])])
        await journal.charge_worker_death([ids[2], ids[4]])
        await journal.charge_worker_death([ids[4]])  # running at as many deaths as allowed: given up, not rerun
        plan = await unfinished(journal, "m", 2)
        assert isinstance(plan, Takeover) and plan.queued == [(2, ops[2]), (3, Skip(ids[3])), (4, Skip(ids[4]))]
        assert [(e.op, e.worker_deaths) for e in plan.given_up] == [(ops[4], 2)]
        for seq in (2, 4):
            await futures.complete(ids[seq], b"{}", JSON_CONTENT_TYPE)
        assert await unfinished(journal, "m", 2) == Takeover(5, [])

    run_on_db(tmp_path / "meta.db", body)
