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
    CreateModelCommand,
    ForwardBackwardArgs,
    Replies,
    SequencedOp,
    ShardOutput,
    Skip,
    SnapshotCommand,
    WorkerCommand,
)
from app.operations import operation
from app.operations.create_model import CreateModel
from app.operations.forward_backward import ForwardBackward
from app.operations.optim_step import OptimStep
from app.ranks.execute import execute_message
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


class OneRankGroup(WorkerGroup):
    """A worker group of one rank in this process, always up, nothing to cancel: the tests' groups say only what
    `send` does."""

    async def start(self) -> None: ...

    async def wait_ready(self) -> None: ...

    async def cancel(self, request_id: str) -> bool:
        return False

    def check_health(self) -> None: ...

    async def stop(self) -> None: ...

    @property
    def world_size(self) -> int:
        return 1


class InProcessGroup(OneRankGroup):
    """One rank running commands on an engine in this process, as a worker's command loop does."""

    def __init__(self, storage: ObjectStorage) -> None:
        self.engine = TrainingEngine(load_base_model(str(TINY_MODEL)))
        self._storage = storage
        self.snapshots = SnapshotWriter(storage)

    def send(self, commands: Sequence[WorkerCommand]) -> Awaitable[Replies]:
        async def run() -> Replies:
            return [execute_message(self.engine, self._storage, self.snapshots, list(commands))]

        return run()


def _batch(seed: int, lengths: tuple[int, ...] = (5, 7)) -> PackedBatch:
    rng = np.random.default_rng(seed)
    vocab = load_base_model(str(TINY_MODEL)).config.vocab_size
    tokens = sum(lengths)
    return PackedBatch(
        tokens=rng.integers(3, vocab, tokens, dtype=np.int64),
        offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        loss_inputs={"target_tokens": rng.integers(3, vocab, tokens, dtype=np.int64)},
    )


def _by_layer(engine: TrainingEngine, model_id: str = "m") -> dict[str, torch.Tensor]:
    """The model's trainable tensors, named without the engine's internal adapter name."""
    return {re.sub(r"\.m\d+\.", ".", name): t for name, t in engine.adapter_state(model_id).items()}


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
        # exact: a rebuild replays the same operations on the snapshot's bytes, the same arithmetic (recovery's promise)
        assert all(torch.equal(expected[k], got[k]) for k in expected)

    run_on_db(tmp_path / "meta.db", body)


def test_models_whose_steps_ran_as_one_pass_are_rebuilt_bit_for_bit(tmp_path: Path) -> None:
    """Three models step together: each message carries their forward_backwards first (one mixed pass on the rank),
    then their optim_steps, and each pass's layout is journaled with the outcome, as the Trainer does. Rebuilt one
    at a time on fresh workers, each equals its live self exactly, though nothing else ran in its passes."""
    storage = ObjectStorage(str(tmp_path / "store"))
    models = {"a": AdapterSpec(rank=4, seed=1), "b": AdapterSpec(rank=8, seed=2), "c": AdapterSpec(rank=4, seed=3)}

    async def body(db: AsyncEngine) -> None:
        futures, journal = FutureStore(db), JournalStore(db)
        live = InProcessGroup(storage)
        for model_id, spec in models.items():
            request_id = (await futures.create("create", model_id, 0))[0]
            await journal.append(model_id, 0, CreateModel(request_id, spec))
            await live.call([CreateModelCommand(model_id, spec)])
            await futures.complete(request_id, b"{}", JSON_CONTENT_TYPE)
        for step in range(3):
            ops: list[tuple[str, int, SequencedOp]] = []
            for i, model_id in enumerate(models):
                ids = [(await futures.create("op", model_id, seq))[0] for seq in (2 * step + 1, 2 * step + 2)]
                lengths = (3 + 5 * i, 9, 2 + 7 * step)[: 1 + (i + step) % 3]  # padded alike in no two passes
                args = ForwardBackwardArgs("cross_entropy", {}, False, _batch(10 * step + i, lengths))
                ops += [(model_id, 2 * step + 1, ForwardBackward(ids[0], args))]
                ops += [(model_id, 2 * step + 2, OptimStep(ids[1], AdamParams(learning_rate=1e-2)))]
            for model_id, seq_id, op in ops:
                await journal.append(model_id, seq_id, op)
            forwards = [(m, s, op) for m, s, op in ops if isinstance(op, ForwardBackward)]
            steps = [(m, s, op) for m, s, op in ops if isinstance(op, OptimStep)]
            replies = (await live.call([operation(op).command(m, op) for m, _, op in forwards + steps]))[0]
            for (model_id, seq_id, op), reply in zip(forwards + steps, replies, strict=True):
                assert not isinstance(reply, CommandError), reply
                if isinstance(reply, ShardOutput):
                    assert reply.layout is not None and len(reply.layout.members) == 3  # they ran as one pass
                    await journal.record_layout(model_id, seq_id, reply.layout)
                await futures.complete(op.request_id, b"{}", JSON_CONTENT_TYPE)
        fresh = InProcessGroup(storage)
        for model_id in sorted(models):
            assert await rebuild(fresh, journal, model_id) == 6
        for model_id in models:  # exact: each model's mixed passes replayed with their recorded layouts
            expected, got = _by_layer(live.engine, model_id), _by_layer(fresh.engine, model_id)
            assert expected.keys() == got.keys() and all(torch.equal(expected[k], got[k]) for k in expected), model_id

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
