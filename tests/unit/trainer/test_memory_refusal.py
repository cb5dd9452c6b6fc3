"""A forward(_backward) whose largest pass on a rank needs more activations than trainer.memory_per_worker_mib is
refused when the Trainer receives it: its future fails with what to change, no worker sees it, and the model's next
operation runs. On the tiny model (float32, activation checkpointing) a forward_backward takes about 64 KiB a token:
an 8192-token datum 524 MiB whole, 262 MiB split across two ranks."""

from __future__ import annotations

import asyncio
from pathlib import Path

from sqlalchemy.ext.asyncio import AsyncEngine

from app.config import WorkerGroupConfig
from app.db.futures import Completed, Failed, FutureStore
from app.db.journal import JournalStore
from app.messages import AdamParams, ForwardBackwardArgs, SequencedOp
from app.operations.create_model import CreateModel
from app.operations.forward_backward import ForwardBackward
from app.operations.optim_step import OptimStep
from app.storage.objects import ObjectStorage
from app.trainer.memory_refusal import memory_refusal
from app.trainer.pass_sizing import PassSizing
from tests.conftest import run_on_db
from tests.unit.trainer.test_pass_sizing import TINY_CONFIG
from tests.unit.trainer.test_rebuild import SPEC, _batch
from tests.unit.trainer.test_worker_deaths import DyingGroup, _fwdbwd, _service


def tiny(budget_mib: int | None, num_workers: int = 1, sequence_parallel: int | None = None) -> PassSizing:
    shape = WorkerGroupConfig(
        num_workers=num_workers, sequence_parallel=sequence_parallel, memory_per_worker_mib=budget_mib
    )
    return PassSizing.of(shape, num_workers, TINY_CONFIG)


def test_a_request_whose_largest_pass_exceeds_the_memory_is_refused_naming_the_setting() -> None:
    error = memory_refusal(_fwdbwd("r", [8192]), tiny(400))
    assert error is not None and error.category == "user" and error.status_code == 400 and error.field == "data"
    assert error.message == (
        "forward_backward of 8192 tokens: its largest pass on a rank (8192 tokens, padding included) needs about "
        "524 MiB of activations, more than a training worker's memory (trainer.memory_per_worker_mib: 400 MiB); it "
        "was not run. To fit: send shorter datums; raise trainer.num_workers (now 1) with trainer.sequence_parallel "
        "unset: a datum of more than 4096 tokens is then split across all of them; or give each worker more memory "
        "and raise trainer.memory_per_worker_mib to match"
    )


def test_what_fits_or_cannot_be_sized_runs() -> None:
    assert memory_refusal(_fwdbwd("r", [2000, 1000]), tiny(400)) is None  # one pass of 2 x 2000 tokens: 250 MiB
    assert memory_refusal(_fwdbwd("r", [8192], forward_only=True), tiny(400)) is None  # no backward: 252 MiB
    assert memory_refusal(_fwdbwd("r", [8192]), tiny(None)) is None  # the memory is unknown
    unknown_base = PassSizing.of(WorkerGroupConfig(num_workers=1, memory_per_worker_mib=1), 1, None)
    assert memory_refusal(_fwdbwd("r", [8192]), unknown_base) is None  # no config.json: no estimate
    assert memory_refusal(OptimStep("r", AdamParams()), tiny(1)) is None


def test_a_datum_too_long_for_one_rank_fits_split_across_two() -> None:
    whole = memory_refusal(_fwdbwd("r", [8192]), tiny(400, num_workers=2, sequence_parallel=1))
    assert whole is not None and "set trainer.sequence_parallel (now 1) to a divisor of" in whole.message
    assert memory_refusal(_fwdbwd("r", [8192]), tiny(400, num_workers=2, sequence_parallel=2)) is None
    assert memory_refusal(_fwdbwd("r", [8192]), tiny(400, num_workers=2)) is None  # unset: every rank


def test_the_trainer_fails_it_before_any_pass_and_the_models_next_operation_runs(tmp_path: Path) -> None:
    """1 MiB a rank: the tiny model's 12-token batch (a 14-token pass, 0.9 MiB) runs, a 40-token datum does not."""
    storage = ObjectStorage(str(tmp_path / "store"))

    async def body(db: AsyncEngine) -> None:
        futures, journal = FutureStore(db), JournalStore(db)
        group = DyingGroup(storage)  # no killers: it records what it is sent
        service = _service(db, group, storage, futures, journal, sizing=tiny(1))
        await service.start()
        request_id = (await futures.create("create", "a", 0))[0]
        await journal.append("a", 0, CreateModel(request_id, SPEC))
        await service.create_model("a", CreateModel(request_id, SPEC))
        ops: list[SequencedOp] = []
        for seq_id, lengths in ((1, (40,)), (2, (5, 7))):
            request_id = (await futures.create("op", "a", seq_id))[0]
            ops.append(ForwardBackward(request_id, ForwardBackwardArgs("cross_entropy", {}, False, _batch(1, lengths))))
            await journal.append("a", seq_id, ops[-1])
        await asyncio.wait_for(asyncio.gather(*(service.submit("a", i, op) for i, op in enumerate(ops, 1))), 60)

        refused, ran = [await futures.get(op.request_id) for op in ops]
        assert isinstance(refused, Failed) and refused.error["category"] == "user"
        assert "trainer.memory_per_worker_mib: 1 MiB" in refused.error["error"]
        assert isinstance(ran, Completed)
        assert not any(ops[0].request_id in sent for sent in group.messages)  # no worker saw it
        assert [e.state for e in await journal.entries("a")] == ["completed", "failed", "completed"]  # never replayed

    run_on_db(tmp_path / "meta.db", body)
