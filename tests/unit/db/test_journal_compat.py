"""The journal's encoding (app/db/journal_codec.py) and its compatibility: journals the release at schema 0004 wrote
(pickled; journal_fixture/release-0004.json, written by that release) are read by this one as the same operations,
on SQLite and PostgreSQL; nothing a row holds is ever run; a row this release cannot read is refused by name."""

from __future__ import annotations

import base64
import json
import pickle
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import journal_codec
from app.db.checkpoints import CheckpointRecord
from app.db.journal import JournalStore
from app.db.journal_codec import JournalFormatError
from app.db.schema import journal
from app.messages import AdamParams, AdapterSpec, DimuonParams, ForwardBackwardArgs, Skip
from app.operations.create_model import CreateModel
from app.operations.forward_backward import ForwardBackward
from app.operations.load_checkpoint import LoadCheckpoint
from app.operations.optim_step import OptimStep
from app.operations.save_checkpoint import SaveCheckpoint
from app.operations.save_for_sampler import SaveForSampler
from app.storage.paths import CheckpointPath
from app.training_data.batch import PackedBatch
from app.training_data.custom_loss_nodes import LossNode
from app.training_data.custom_losses import CustomLossProgram
from tests.conftest import run_on_db

FIXTURE = Path(__file__).parent / "journal_fixture" / "release-0004.json"


def _fixture_operations() -> list[Any]:
    """What write_release_0004.py journaled, built with this release's classes."""
    batch = PackedBatch(
        np.array([5, 6, 7, 8, 9], dtype=np.int64),
        np.array([0, 2, 5], dtype=np.int64),
        {
            "target_tokens": np.array([6, 7, 8, 9, 10], dtype=np.int64),
            "weights": np.array([0.0, 1.0, 0.5, 1.0, 2.0], dtype=np.float32),
            "advantages": np.array([[1.5, -1], [0, 2], [3, 4], [5, 6], [7, 8]], dtype=np.float32),
        },
    )
    program = CustomLossProgram(
        "loss-1",
        "neg_mean",
        (("logprobs", 1), ("weights", 1)),
        (
            LossNode("placeholder", "logprobs", "logprobs", [], {}),
            LossNode("placeholder", "weights", "weights", [], {}),
            LossNode("call_function", "mul", "torch.mul", [{"ref": "logprobs"}, {"ref": "weights"}], {}),
            LossNode("call_method", "sum", "sum", [{"ref": "mul"}], {"dim": 0}),
            LossNode("output", "output", "output", [{"tuple": [{"ref": "sum"}, {"dict": {}}]}], {}),
        ),
    )
    record = CheckpointRecord(
        CheckpointPath("model-a", "weights", "step-10"),
        "model-a/weights/step-10/0123456789ab",
        0,
        0.0,
        expires_at=1_900_000_000.5,
        user_metadata={"note": "fixture"},
    )
    load = LoadCheckpoint("req-1", "tinker://model-z/weights/w", "model-z/weights/w/aaaaaaaaaaaa", True)
    return [
        CreateModel("req-0", AdapterSpec(rank=8, seed=3, train_attn=True, train_mlp=False, alpha=16.0)),
        CreateModel("req-1", AdapterSpec(rank=4, seed=9, role="critic", optimizer="dimuon"), load=load),
        ForwardBackward("req-2", ForwardBackwardArgs("importance_sampling", {"clip": 0.2}, False, batch)),
        ForwardBackward("req-3", ForwardBackwardArgs("cross_entropy", {}, True, batch)),
        ForwardBackward("req-4", ForwardBackwardArgs("custom", {}, False, batch, custom_loss=program)),
        OptimStep("req-5", AdamParams(learning_rate=3e-4, beta2=0.999, weight_decay=0.01, grad_clip_norm=1.0)),
        OptimStep("req-6", DimuonParams(learning_rate=0.02, grad_clip_norm=-1.0)),
        SaveCheckpoint("req-7", record, overwrite=True),
        SaveForSampler("req-8", "sampling-1", "model-a/sampler_weights/ephemeral/bbbbbbbbbbbb"),
        load,
        Skip("req-9"),
    ]


def _same(actual: Any, expected: Any) -> bool:
    """Equal types, fields and arrays (dtype, shape and bytes): the encodings are byte-equal."""
    return type(actual) is type(expected) and journal_codec.encode(actual) == journal_codec.encode(expected)


def _release_0004_database(url: str, rows: list[dict[str, Any]]) -> None:
    """A database as the release at schema 0004 left it, its journal holding `rows` (pickled operations)."""

    async def insert_rows(db: AsyncEngine) -> None:
        async with db.begin() as conn:
            for row in rows:
                values = {"model_id": "model-a", "seq_id": row["seq_id"], "request_id": row["request_id"]}
                await conn.execute(insert(journal).values(**values, op=base64.b64decode(row["op"]), created_at=1.0))

    run_on_db(url, insert_rows, revision="0004")


def test_a_journal_the_previous_release_wrote_replays_as_the_same_operations(db_url: str) -> None:
    """Upgrading rewrites each pickled row in the versioned encoding; the journal then reads back the operations
    the fixture's release journaled, field for field and array for array."""
    rows = json.loads(FIXTURE.read_text())
    _release_0004_database(db_url, rows)

    async def body(db: AsyncEngine) -> None:
        entries = await JournalStore(db).entries("model-a")
        expected = _fixture_operations()
        assert [e.seq_id for e in entries] == list(range(len(expected)))
        for entry, op in zip(entries, expected, strict=True):
            assert _same(entry.op, op), (entry.seq_id, entry.op, op)
        fb = entries[2].op
        assert isinstance(fb, ForwardBackward) and isinstance(fb.args.batch, PackedBatch)
        assert fb.args.batch.loss_inputs["advantages"].shape == (5, 2) and fb.args.batch.tokens.flags.writeable

    run_on_db(db_url, body)  # migrates to head first


def test_every_operation_round_trips_and_new_fields_get_their_defaults() -> None:
    for op in _fixture_operations():
        assert _same(journal_codec.decode(journal_codec.encode(op)), op)
    # a row written before AdapterSpec had `optimizer` and `alpha`: the defaults, as for a new model
    older = journal_codec.encode_tree(
        journal_codec.Record(
            "CreateModel", {"request_id": "r", "spec": journal_codec.Record("AdapterSpec", {"rank": 4, "seed": 1})}
        )
    )
    assert journal_codec.decode(older) == CreateModel("r", AdapterSpec(rank=4, seed=1))


@pytest.mark.parametrize(
    ("blob", "message"),
    [
        (pickle.dumps(Skip("r"), protocol=5), "unknown header"),
        (journal_codec.MAGIC + bytes([9]) + msgpack.packb(None), "format 9"),
        (journal_codec.encode_tree(journal_codec.Record("Unheard", {})), "'Unheard'"),
        (journal_codec.encode_tree(journal_codec.Record("Skip", {"request_id": "r", "extra": 1})), "['extra']"),
        (journal_codec.encode_tree(AdamParams()), "not an operation"),
        (journal_codec.encode_tree(journal_codec.Record("Skip", {})), "Skip cannot be read"),
    ],
)
def test_a_row_this_release_cannot_read_is_refused_by_name(blob: bytes, message: str) -> None:
    with pytest.raises(JournalFormatError, match=message.replace("[", r"\[").replace("]", r"\]")):
        journal_codec.decode(blob)


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


def test_upgrading_never_runs_what_a_pickled_row_names(db_url: str, tmp_path: Path) -> None:
    """Write access to the database is not code execution on the trainers: a pickled row naming any callable but
    an operation's parts stops the upgrade with the row named, and the callable never ran."""
    marker = tmp_path / "ran"
    hostile = base64.b64encode(pickle.dumps([Skip("r"), _Payload(marker)], protocol=5)).decode()
    _release_0004_database(db_url, [{"seq_id": 3, "request_id": "r", "op": hostile}])

    async def body(db: AsyncEngine) -> None:
        raise AssertionError("the upgrade should have stopped")

    with pytest.raises(RuntimeError, match=r"journal row \('model-a', 3\) cannot be read"):
        run_on_db(db_url, body)
    assert not marker.exists()
