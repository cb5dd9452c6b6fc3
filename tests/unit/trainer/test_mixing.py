"""Which ready operations of distinct models mix (app.trainer.mixing.MixPolicy), and the message that carries them."""

from __future__ import annotations

import numpy as np

from app.config import WorkerGroupConfig
from app.messages import AdamParams, ForwardBackwardArgs, ForwardBackwardCommand, OptimStepCommand, SnapshotCommand
from app.operations.forward_backward import ForwardBackward
from app.operations.optim_step import OptimStep
from app.trainer.mixing import MixPolicy, mixed_message
from app.training_data.batch import PackedBatch

ADAM = AdamParams(learning_rate=1e-3)


def _forward(lengths: list[int]) -> ForwardBackward:
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    batch = PackedBatch(np.zeros(int(offsets[-1]), np.int64), offsets)
    return ForwardBackward("r", ForwardBackwardArgs("cross_entropy", {}, False, batch))


def test_forwards_mix_up_to_the_limit_within_one_micro_batch_on_every_rank() -> None:
    mixes = MixPolicy(WorkerGroupConfig(mixed_pass_models=3, micro_batch_tokens=256), world_size=2)
    eight_by_16 = _forward([16] * 8)  # 4 x 16 = 64 padded tokens on each rank
    assert mixes([eight_by_16, eight_by_16, eight_by_16])  # 12 x 16 = 192 <= 256 on each rank
    assert not mixes([eight_by_16] * 4)  # over mixed_pass_models
    assert not mixes([eight_by_16, _forward([16, 16, 16, 100])])  # rank 1: 4 x 100 padded > 256
    assert not mixes([eight_by_16, OptimStep("s", ADAM)])  # only forward(_backward)s mix
    assert not MixPolicy(WorkerGroupConfig(mixed_pass_models=1), world_size=2)([eight_by_16, eight_by_16])


def test_a_mixed_message_puts_each_runs_forward_first_and_keeps_each_runs_order() -> None:
    args = _forward([4]).args
    a = [ForwardBackwardCommand("a", args), OptimStepCommand("a", ADAM), SnapshotCommand("a", "a/s")]
    b = [ForwardBackwardCommand("b", args), ForwardBackwardCommand("b", args), OptimStepCommand("b", ADAM)]
    message, positions = mixed_message([a, b])
    assert message == [a[0], b[0], a[1], a[2], b[1], b[2]]
    assert [[message[i] for i in where] for where in positions] == [a, b]
    alone, where = mixed_message([a[1:], b])  # a run that opens with no forward: one after another
    assert alone == a[1:] + b and [[alone[i] for i in w] for w in where] == [a[1:], b]
