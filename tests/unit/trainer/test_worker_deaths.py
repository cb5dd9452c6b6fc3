"""An operation that kills the training workers: which operations a death is charged to, the error of one given up,
and a TrainerService whose workers die each time one operation runs (a real engine, journal and futures): that
operation fails after two deaths with what to change, and everything else, on its model and another, goes on; one
that ran in a pass with another model's fails alone too."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.config import WorkerGroupConfig
from app.db.checkpoints import CheckpointStore
from app.db.futures import Completed, Failed, FutureStore
from app.db.history import HistoryStore
from app.db.journal import JournalStore
from app.db.metadata import MetadataStore, TrainingRun
from app.errors import GroupRestarted, ServerError
from app.messages import (
    AdamParams,
    ForwardBackwardArgs,
    ForwardBackwardCommand,
    OptimStepCommand,
    Replies,
    SequencedOp,
    SnapshotCommand,
    WorkerCommand,
)
from app.operations.create_model import CreateModel
from app.operations.forward_backward import ForwardBackward
from app.operations.optim_step import OptimStep
from app.storage.objects import ObjectStorage
from app.trainer.service import TrainerDeps, TrainerService
from app.trainer.worker_deaths import blamed, too_large
from app.trainer.worker_group import WorkerGroup
from app.training.base_model import load_base_model
from app.training.engine import TrainingEngine
from app.training_data.batch import PackedBatch
from tests.conftest import TINY_MODEL, run_on_db
from tests.unit.trainer.test_pass_sizing import sizing
from tests.unit.trainer.test_rebuild import SPEC, InProcessGroup, _batch


def test_a_death_is_charged_to_the_forwards_that_were_running_else_to_every_operation() -> None:
    fb, fwd = (ForwardBackwardCommand("m", _fwdbwd(request_id, [3]).args, request_id) for request_id in ("fb", "fwd"))
    step = OptimStepCommand("m", AdamParams(), request_id="step")
    snapshot = SnapshotCommand("m", "x")  # serves no request
    assert blamed([fb, step, fwd, snapshot], {"fb", "step", "fwd"}) == ["fb", "fwd"]
    assert blamed([step, snapshot], {"step"}) == ["step"]
    assert blamed([fb, step], {"other"}) == []  # not running: not charged


def test_the_largest_pass_is_a_micro_batch_of_a_rank_padded_to_its_longest_or_a_share_of_a_split_datum() -> None:
    lengths = np.array([10, 3, 7, 2, 1])  # rank 0: 10, 7, 1 -> 3 x 10; rank 1: 3, 2 -> 2 x 3
    assert sizing(2).largest_pass_tokens(lengths) == 30
    assert sizing(8).largest_pass_tokens(lengths) == 10
    assert sizing(1).largest_pass_tokens(lengths) == 50
    assert sizing(2, micro_batch_tokens=19).largest_pass_tokens(lengths) == 14  # rank 0: [10], [7, 1]; rank 1: [3, 2]
    long = np.array([9000, 100])  # 9000 > sequence_parallel_min_tokens: split in 4, 2250 tokens a rank
    assert sizing(4, sequence_parallel=4).largest_pass_tokens(long) == 2250
    assert sizing(4).largest_pass_tokens(long) == 9000


def _fwdbwd(request_id: str, lengths: list[int], forward_only: bool = False) -> ForwardBackward:
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    batch = PackedBatch(np.zeros(offsets[-1], dtype=np.int64), offsets, {})
    return ForwardBackward(request_id, ForwardBackwardArgs("cross_entropy", {}, forward_only, batch))


def test_the_error_says_what_happened_what_it_needs_and_what_to_change() -> None:
    def estimate(tokens: int, backward: bool) -> int:
        return tokens * (3 * 2**20 if backward else 2**20)

    replicated = sizing(2, estimate, sharding="replicate", activation_checkpointing=False, dtype="float32")
    error = too_large(_fwdbwd("r", [1000, 500, 800, 100]), 2, replicated)  # rank 0: 1000, 800
    assert error.category == "user" and error.status_code == 400 and error.field == "data"
    assert error.message == (
        "forward_backward of 2400 tokens (its largest pass on a rank: 2000 tokens, padding included) was running when "
        "the training workers died twice (killed for memory, most likely); it was not run again and the model has no "
        "gradients from it. That pass needs about 5.9 GiB of activations. To fit: lower trainer.micro_batch_tokens "
        "(now 16384; a pass then holds fewer datums); set trainer.activation_checkpointing: true; set "
        "trainer.sharding: fsdp (each rank then holds 1/num_workers of the base's weights); set trainer.dtype: "
        "bfloat16 (half the memory); or give each worker more memory"
    )
    forward = too_large(_fwdbwd("r", [100]), 3, sizing(2)).message  # no estimate: the size is left out
    assert forward.startswith("forward_backward of 100 tokens (its largest pass on a rank: 100 tokens")
    assert "died 3 times" in forward and "needs about" not in forward
    assert forward.endswith("To fit: send shorter datums; or give each worker more memory")
    forward = too_large(_fwdbwd("r", [100], forward_only=True), 2, sizing(2, estimate)).message
    assert forward.startswith("forward of 100 tokens") and "about 100 MiB of activations" in forward
    step = too_large(OptimStep("r", AdamParams()), 1, sizing(2, estimate)).message
    assert step.startswith("optim_step was running when the training workers died once (killed for memory")


class DyingGroup(InProcessGroup):
    """Workers that die each time they take a message with a command of `killers`, and come back (wait_ready) with
    no models, as a restarted Ray Train group does."""

    def __init__(self, storage: ObjectStorage) -> None:
        super().__init__(storage)
        self.killers: set[str] = set()
        self.deaths = 0
        self.messages: list[set[str]] = []  # the request ids of each message sent
        self._down: tuple[str, ...] | None = None  # what the ranks were running when they died, until they are back

    def send(self, commands: Sequence[WorkerCommand]) -> Awaitable[Replies]:
        self.messages.append({c.request_id for c in commands if c.request_id})

        async def dying() -> Replies:
            running = tuple(c.request_id for c in commands if c.request_id)
            if self._down is None and self.killers & set(running):
                self.deaths += 1
                self._down = running
            if self._down is not None:
                raise GroupRestarted("restarted", running=self._down)
            return await super(DyingGroup, self).send(commands)

        return dying()

    async def wait_ready(self) -> None:
        if self._down is not None:
            self._down = None
            self.engine = TrainingEngine(load_base_model(str(TINY_MODEL)))


def _service(
    db: AsyncEngine,
    group: WorkerGroup,
    storage: ObjectStorage,
    futures: FutureStore,
    journal: JournalStore,
    **options: Any,
) -> TrainerService:
    """Trainer "t" over `group`, on the database's stores; `options`: TrainerDeps' settings."""
    stores = (futures, MetadataStore(db), CheckpointStore(db), storage, journal, HistoryStore(db, 100))
    return TrainerService("t", TrainerDeps(group, *stores, **options))


def test_an_operation_that_kills_the_workers_fails_and_everything_else_goes_on(tmp_path: Path) -> None:
    storage = ObjectStorage(str(tmp_path / "store"))

    async def body(db: AsyncEngine) -> None:
        futures, journal = FutureStore(db), JournalStore(db)
        group = DyingGroup(storage)
        service = _service(
            db, group, storage, futures, journal, sizing=sizing(1, lambda tokens, backward: tokens * 2**20)
        )
        await service.start()

        async def accept(model_id: str, seq_id: int, make: Callable[[str], SequencedOp]) -> tuple[str, asyncio.Task]:
            """What the ingress does: create the future, journal the operation, submit it (not awaited)."""
            request_id = (await futures.create("op", model_id, seq_id))[0]
            op = make(request_id)
            await journal.append(model_id, seq_id, op)
            return request_id, asyncio.create_task(service.submit(model_id, seq_id, op))

        def fwdbwd(seed: int) -> Callable[[str], SequencedOp]:
            return lambda request_id: ForwardBackward(
                request_id, ForwardBackwardArgs("cross_entropy", {}, False, _batch(seed))
            )

        def step(request_id: str) -> SequencedOp:
            return OptimStep(request_id, AdamParams(learning_rate=1e-2))

        for model_id in ("a", "b"):
            request_id = (await futures.create("create", model_id, 0))[0]
            await journal.append(model_id, 0, CreateModel(request_id, SPEC))
            await service.create_model(model_id, CreateModel(request_id, SPEC))
        b_first = [await accept("b", 1, fwdbwd(1)), await accept("b", 2, step)]
        await asyncio.gather(*(task for _, task in b_first))
        killer = (await futures.create("op", "a", 1))[0]
        group.killers.add(killer)
        await journal.append("a", 1, fwdbwd(2)(killer))
        sent = [
            (killer, asyncio.create_task(service.submit("a", 1, fwdbwd(2)(killer)))),
            await accept("a", 2, step),
            await accept("b", 3, fwdbwd(3)),
            await accept("b", 4, step),
        ]
        await asyncio.wait_for(asyncio.gather(*(task for _, task in sent)), 60)
        after = [await accept("a", 3, fwdbwd(4)), await accept("a", 4, step), await accept("b", 5, fwdbwd(5))]
        await asyncio.wait_for(asyncio.gather(*(task for _, task in after)), 60)

        assert group.deaths == 2
        failed = await futures.get(killer)
        assert isinstance(failed, Failed) and failed.error["category"] == "user"
        assert failed.error["error"].startswith("forward_backward of 12 tokens (its largest pass on a rank: 14 tokens")
        assert "died twice" in failed.error["error"] and "about 14 MiB of activations" in failed.error["error"]
        others = [request_id for request_id, _ in b_first + sent[1:] + after]
        assert [type(await futures.get(request_id)) for request_id in others] == [Completed] * len(others)
        entries = {e.request_id: e for e in await journal.entries("a")}
        assert (entries[killer].state, entries[killer].worker_deaths) == ("failed", 2)  # no rebuild replays it
        assert {e.worker_deaths for e in await journal.entries("b")} == {0}

    run_on_db(tmp_path / "meta.db", body)


def test_a_killer_that_shared_a_pass_fails_alone(tmp_path: Path) -> None:
    """A's killing forward_backward and B's are ready together, so they go as one pass and the workers die. The
    message is resent one model at a time: the second death is A's alone, so A's fails (two deaths) and B's, charged
    once, completes."""
    storage = ObjectStorage(str(tmp_path / "store"))

    async def body(db: AsyncEngine) -> None:
        futures, journal = FutureStore(db), JournalStore(db)
        group = DyingGroup(storage)
        shape = WorkerGroupConfig(max_dispatched_runs=1)  # C's step holds the only slot while A's and B's arrive
        service = _service(db, group, storage, futures, journal, shape=shape)
        await service.start()
        for model_id in ("a", "b", "c"):
            request_id = (await futures.create("create", model_id, 0))[0]
            await journal.append(model_id, 0, CreateModel(request_id, SPEC))
            await service.create_model(model_id, CreateModel(request_id, SPEC))
        ops = {}
        for seed, model_id in enumerate(("c", "a", "b")):
            request_id = (await futures.create("op", model_id, 1))[0]
            ops[model_id] = ForwardBackward(request_id, ForwardBackwardArgs("cross_entropy", {}, False, _batch(seed)))
            await journal.append(model_id, 1, ops[model_id])
        group.killers.add(ops["a"].request_id)
        tasks = [asyncio.create_task(service.submit(model_id, 1, op)) for model_id, op in ops.items()]
        await asyncio.wait_for(asyncio.gather(*tasks), 60)

        assert {ops["a"].request_id, ops["b"].request_id} in group.messages  # they went as one pass
        assert group.deaths == 2
        assert isinstance(await futures.get(ops["a"].request_id), Failed)
        for model_id in ("b", "c"):
            assert isinstance(await futures.get(ops[model_id].request_id), Completed), model_id
        deaths = {model_id: (await journal.entries(model_id))[1].worker_deaths for model_id in ops}
        assert deaths == {"a": 2, "b": 1, "c": 0}

    run_on_db(tmp_path / "meta.db", body)


class DiesOnce(DyingGroup):
    """Workers that die the first time they take a message with a command of `killers`, and never again."""

    async def wait_ready(self) -> None:
        self.killers.clear()
        await super().wait_ready()


class NeverBack(DyingGroup):
    """Workers that die under a command of `killers` and never come back."""

    async def wait_ready(self) -> None:
        if self.deaths:
            raise ServerError("worker group for t did not start within 600 s")


async def _two_ops_under_a_death(db: AsyncEngine, group: DyingGroup, storage: ObjectStorage) -> list[SequencedOp]:
    """Model "a", new on a trainer over `group`, and two forward_backwards sent to it pipelined (as the SDK does), the
    first of them among the group's killers; returns them once both submits have returned."""
    futures, journal = FutureStore(db), JournalStore(db)
    service = _service(db, group, storage, futures, journal)
    await service.start()
    request_id = (await futures.create("create", "a", 0))[0]
    await journal.append("a", 0, CreateModel(request_id, SPEC))
    await service.create_model("a", CreateModel(request_id, SPEC))
    ops: list[SequencedOp] = []
    for seq_id in (1, 2):
        request_id = (await futures.create("op", "a", seq_id))[0]
        ops.append(ForwardBackward(request_id, ForwardBackwardArgs("cross_entropy", {}, False, _batch(seq_id))))
        await journal.append("a", seq_id, ops[-1])
    group.killers.add(ops[0].request_id)
    submits = [service.submit("a", seq_id, op) for seq_id, op in enumerate(ops, 1)]
    await asyncio.wait_for(asyncio.gather(*submits, return_exceptions=True), 60)
    return ops


@pytest.mark.filterwarnings("error")  # a coroutine left unawaited fails the test
def test_a_death_with_nothing_to_replay_loses_no_request(tmp_path: Path) -> None:
    """The workers die under a model's first operation, so its rebuild replays nothing (its creation only): that
    operation and the one sent after it are resent and complete, and no send is left unawaited."""
    storage = ObjectStorage(str(tmp_path / "store"))

    async def body(db: AsyncEngine) -> None:
        group = DiesOnce(storage)
        ops = await _two_ops_under_a_death(db, group, storage)
        assert group.deaths == 1
        assert [type(await FutureStore(db).get(op.request_id)) for op in ops] == [Completed, Completed]
        gc.collect()  # an unawaited coroutine warns when it is collected

    run_on_db(tmp_path / "meta.db", body)


@pytest.mark.filterwarnings("error")
def test_workers_that_never_come_back_fail_the_requests_with_the_reason(tmp_path: Path) -> None:
    """A death, and a recovery that fails: the model is lost, the operations sent to it fail with the reason, and the
    sends resent to the dead group are dropped without a coroutine left unawaited."""
    storage = ObjectStorage(str(tmp_path / "store"))

    async def body(db: AsyncEngine) -> None:
        for op in await _two_ops_under_a_death(db, NeverBack(storage), storage):
            failed = await FutureStore(db).get(op.request_id)
            assert isinstance(failed, Failed) and "did not start within 600 s" in failed.error["error"], failed
        gc.collect()

    run_on_db(tmp_path / "meta.db", body)


class DownForGood(DyingGroup):
    """Workers that die under a command of `killers`: the first time they come back, the second time Ray Train gives
    up on them (the run ends, the message is never answered, check_health raises)."""

    def __init__(self, storage: ObjectStorage) -> None:
        super().__init__(storage)
        self.ended: tuple[str, ...] | None = None  # what the ranks ran when the run ended
        self.run_ended = asyncio.Event()

    def send(self, commands: Sequence[WorkerCommand]) -> Awaitable[Replies]:
        running = tuple(c.request_id for c in commands if c.request_id)
        if self.deaths and self.killers & set(running):
            self.ended = running
            self.run_ended.set()
            return asyncio.get_running_loop().create_future()  # never answered
        return super().send(commands)

    async def running(self) -> tuple[str, ...]:
        return self.ended or ()

    def check_health(self) -> None:
        if self.ended is not None:
            raise ServerError("worker group for t is down: Training failed due to worker errors")


def test_a_death_that_ends_the_group_counts_for_the_trainer_that_replaces_it(tmp_path: Path) -> None:
    """The workers die under an operation, come back, and die under it again, and Ray Train gives up: the trainer's
    health check charges that death before the replica goes, so the operation fails there at its limit (2) with what
    to change, and the trainer that replaces it does not run it again; the model's next operation runs."""
    storage = ObjectStorage(str(tmp_path / "store"))

    async def body(db: AsyncEngine) -> None:
        futures, journal = FutureStore(db), JournalStore(db)
        meta = MetadataStore(db)
        session = await meta.create_session(None, [], {})
        await meta.add_training_run(TrainingRun("a", session, "tiny", SPEC.rank, "policy", "t", {}, {}, 0.0, False))
        group = DownForGood(storage)
        service = _service(db, group, storage, futures, journal)
        await service.start()
        request_id = (await futures.create("create", "a", 0))[0]
        await journal.append("a", 0, CreateModel(request_id, SPEC))
        await service.create_model("a", CreateModel(request_id, SPEC))
        killer = (await futures.create("op", "a", 1))[0]
        op = ForwardBackward(killer, ForwardBackwardArgs("cross_entropy", {}, False, _batch(1)))
        await journal.append("a", 1, op)
        group.killers.add(killer)
        running = asyncio.create_task(service.submit("a", 1, op))
        await asyncio.wait_for(group.run_ended.wait(), 60)
        with pytest.raises(ServerError, match="down"):
            await service.check_health()
        with pytest.raises(ServerError, match="down"):
            await service.check_health()  # charged once
        running.cancel()

        assert [e.worker_deaths for e in await journal.entries("a")] == [0, 2]
        failed = await futures.get(killer)
        assert isinstance(failed, Failed) and failed.error["category"] == "user"
        assert "died twice" in failed.error["error"]
        replacement = _service(db, InProcessGroup(storage), storage, futures, journal)
        await replacement.start()
        step = (await futures.create("op", "a", 2))[0]
        await journal.append("a", 2, OptimStep(step, AdamParams(learning_rate=1e-2)))
        await asyncio.wait_for(replacement.submit("a", 2, OptimStep(step, AdamParams(learning_rate=1e-2))), 60)
        assert isinstance(await futures.get(step), Completed)
        assert isinstance(await futures.get(killer), Failed)  # not run again

    run_on_db(tmp_path / "meta.db", body)
