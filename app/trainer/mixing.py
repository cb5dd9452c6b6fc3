"""Which models' ready operations run as one pass (app.training.mixed_pass), and the one message that carries them.

Only forward passes mix (as their operations' `forward` and their commands' `forward_pass` declare): of distinct
models, at most `worker_group.mixed_pass_models`, fitting one micro-batch on every rank together. The ranks run
consecutive forward passes of distinct models in a message as one pass (app.ranks.execute; one after another where the
engine cannot mix them: a mixture of experts), so a mixed dispatch puts each run's first command at the front; the rest
of each run follows, in its own order.
"""

from __future__ import annotations

from collections.abc import Sequence

from app.config import WorkerGroupConfig
from app.messages import SequencedOp, WorkerCommand, runs_a_pass
from app.operations import operation
from app.training.micro_batches import fits_one_pass


class MixPolicy:
    """Whether operations at the heads of distinct models' queues may run as one pass."""

    def __init__(self, shape: WorkerGroupConfig, world_size: int) -> None:
        self._limit = shape.mixed_pass_models
        self._world_size = world_size
        self._micro_batch_tokens = shape.micro_batch_tokens

    def __call__(self, heads: Sequence[SequencedOp]) -> bool:
        passes = [forward for op in heads if (forward := operation(op).forward(op)) is not None]
        if len(heads) > self._limit or len(passes) < len(heads):
            return False
        return fits_one_pass([forward.batch.lengths for forward in passes], self._world_size, self._micro_batch_tokens)


def mixed_message(runs: Sequence[list[WorkerCommand]]) -> tuple[list[WorkerCommand], list[list[int]]]:
    """One message for several models' runs: each run's first command in front (a forward pass, see above)
    when there are two or more runs, then the rest of each. Returns the message and, per run, where its commands are
    in it."""
    if len(runs) < 2 or not all(run and runs_a_pass(run[0]) for run in runs):
        message = [command for run in runs for command in run]
        starts = [sum(len(r) for r in runs[:j]) for j in range(len(runs))]
        return message, [list(range(start, start + len(run))) for start, run in zip(starts, runs, strict=True)]
    message = [run[0] for run in runs]
    positions = [[j] for j in range(len(runs))]
    for run, where in zip(runs, positions, strict=True):
        where += range(len(message), len(message) + len(run) - 1)
        message += run[1:]
    return message, positions
