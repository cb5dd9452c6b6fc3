"""Writes release-0004.json: journal rows exactly as the release at schema revision 0004 stored them (operations
pickled), one of every kind of operation. Run once on that release (commit 90c3326):
    .venv/bin/python tests/unit/db/journal_fixture/write_release_0004.py
test_journal_compat.py checks that this release reads (replays) each row as the same operation. Kept for the record:
it imports that release's classes, so it no longer runs on later ones."""

from __future__ import annotations

import base64
import json
import pickle
from pathlib import Path

import numpy as np

from app.db.checkpoints import CheckpointRecord
from app.messages import (
    AdamParams,
    AdapterSpec,
    CreateModel,
    DimuonParams,
    ForwardBackward,
    ForwardBackwardArgs,
    LoadCheckpoint,
    OptimStep,
    SaveCheckpoint,
    SaveForSampler,
    Skip,
)
from app.storage.paths import CheckpointPath
from app.training.batch import PackedBatch
from app.training.custom_loss.program import CustomLossProgram, LossNode

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
OPS = [
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

rows = [
    {"seq_id": seq, "request_id": op.request_id, "op": base64.b64encode(pickle.dumps(op, protocol=5)).decode()}
    for seq, op in enumerate(OPS)
]
Path(__file__).with_name("release-0004.json").write_text(json.dumps(rows, indent=1) + "\n")
