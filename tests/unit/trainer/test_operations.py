"""The operations (app.operations): the worker command each sends and the reply it builds,
with checkpoint commits against a real SQLite file and a local storage directory."""

from __future__ import annotations

import asyncio
import json
import typing
from pathlib import Path

import numpy as np
import pytest

from app.db.checkpoints import CheckpointRecord, CheckpointStore
from app.errors import UserError
from app.messages import (
    AdamParams,
    ForwardBackwardArgs,
    ForwardBackwardCommand,
    LoadStateCommand,
    OptimStepCommand,
    SaveCommand,
    SavedParts,
    ShardOutput,
)
from app.operations import CheckpointCommitter, operation
from app.operations.forward_backward import ForwardBackward
from app.operations.load_checkpoint import LoadCheckpoint
from app.operations.optim_step import OptimStep
from app.operations.save_checkpoint import SaveCheckpoint
from app.operations.save_for_sampler import SaveForSampler
from app.storage.objects import ObjectStorage
from app.storage.paths import checkpoint_path
from app.training_data.batch import PackedBatch
from tests.conftest import run_on_db

MODEL = "s:train:0"


def _record(kind: str, name: str = "c1") -> CheckpointRecord:
    path = checkpoint_path(MODEL, kind, name)
    return CheckpointRecord(path, path.new_location(), 0, 0.0)


@pytest.mark.parametrize(
    ("kind", "what", "reply_type"),
    [
        ("weights", "state", "save_weights"),
        ("sampler_weights", "adapter", "save_weights_for_sampler"),
        ("external_weights", "export", "save_weights_external"),
    ],
)
def test_save_checkpoint_writes_its_kind_and_commits_it(
    tmp_path: Path, kind: str, what: SavedParts, reply_type: str
) -> None:
    storage = ObjectStorage(str(tmp_path / "blobs"))
    op = SaveCheckpoint("r1", _record(kind))
    sent = operation(op).command(MODEL, op)
    assert sent == SaveCommand(MODEL, op.record.location, what)
    assert sent.name == f"save_{what}" and sent.request_id == ""  # the Trainer sets it when it dispatches the op
    storage.write(op.record.location, lambda out: (out.mkdir(parents=True), (out / "f").write_bytes(b"x" * 5)))

    async def body(db: typing.Any) -> None:
        store = CheckpointStore(db)
        reply = await operation(op).reply(MODEL, op, [5, 0], CheckpointCommitter(store, storage))
        assert json.loads(reply.payload) == {"path": op.record.path.uri, "type": reply_type}
        committed = await store.get(op.record.path)
        assert committed.size_bytes == 5 and committed.created_at > 0
        again = SaveCheckpoint("r2", _record(kind))  # same name, no overwrite: refused, its files removed
        storage.write(again.record.location, lambda out: (out.mkdir(parents=True), (out / "f").write_bytes(b"y")))
        with pytest.raises(UserError, match="already exists"):
            await operation(again).reply(MODEL, again, [1], CheckpointCommitter(store, storage))
        assert not (tmp_path / "blobs" / again.record.location).exists()

    run_on_db(tmp_path / "db.sqlite", body)


def test_replies_of_the_other_operations(tmp_path: Path) -> None:
    committer = CheckpointCommitter(None, ObjectStorage(str(tmp_path)))  # type: ignore[arg-type] - unused here
    batch = PackedBatch(np.array([1, 2, 3], np.int64), np.array([0, 3], np.int64))
    fwd = ForwardBackward("r", ForwardBackwardArgs("cross_entropy", {}, True, batch))
    assert operation(fwd).name(fwd) == "forward"
    assert operation(fwd).command(MODEL, fwd) == ForwardBackwardCommand(MODEL, fwd.args)
    load = LoadCheckpoint("r", "tinker://s:train:0/weights/c1", "loc", with_optimizer=True)
    assert operation(load).command(MODEL, load) == LoadStateCommand(MODEL, "loc", with_optimizer=True)
    sampler = SaveForSampler("r", "s:sample:3", "ephemeral/s:sample:3")
    assert operation(sampler).command(MODEL, sampler) == SaveCommand(MODEL, "ephemeral/s:sample:3", "adapter")
    step = OptimStep("r", AdamParams(learning_rate=0.1))
    assert operation(step).command(MODEL, step) == OptimStepCommand(MODEL, AdamParams(learning_rate=0.1))
    shard = ShardOutput(np.array([0]), np.array([0, 3]), {}, 1.5, loss_cost_tokens=7)
    forwarded = asyncio.run(operation(fwd).reply(MODEL, fwd, [shard, shard], committer))
    assert forwarded.cost_tokens == 7 and forwarded.metrics == {"loss:sum": 3.0}  # a custom loss's cost, charged

    async def replies() -> list[dict]:
        return [
            json.loads((await operation(op).reply(MODEL, op, per_rank, committer)).payload)
            for op, per_rank in ((load, [None, None]), (sampler, [10, 0]), (step, [{"grad_norm:mean": 2.0}] * 2))
        ]

    assert asyncio.run(replies()) == [
        {"path": load.path, "model_id": MODEL, "type": "load_weights"},
        {"sampling_session_id": "s:sample:3", "type": "save_weights_for_sampler"},
        {"metrics": {"grad_norm:mean": 2.0}},
    ]
