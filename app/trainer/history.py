"""What the trainer records of each finished training step for the run's history (app.db.history)."""

from __future__ import annotations

import time

from app.db.history import HistoryPoint, HistoryStore
from app.messages import ForwardBackward, OptimStep, SequencedOp
from app.trainer.operations import Reply


class HistoryRecorder:
    def __init__(self, store: HistoryStore) -> None:
        self._store = store
        self._steps: dict[str, int] = {}  # model_id -> optim_steps finished

    async def resume(self, model_id: str) -> None:
        """Count a model's steps on from its history (a new model has none)."""
        self._steps[model_id] = await self._store.steps_done(model_id)

    async def record(self, model_id: str, seq_id: int, op: SequencedOp, reply: Reply) -> None:
        """Record `op`'s outcome if it is a training step (forward, forward_backward or optim_step)."""
        if reply.metrics is None or not isinstance(op, ForwardBackward | OptimStep):
            return
        step = self._steps.get(model_id, 0)
        if isinstance(op, OptimStep):
            step += 1
            self._steps[model_id] = step
            kind, tokens, learning_rate = "optim_step", 0, op.params.learning_rate
        else:
            kind = "forward" if op.args.forward_only else "forward_backward"
            tokens, learning_rate = int(op.args.batch.offsets[-1]), None
        point = HistoryPoint(seq_id, kind, time.time(), step, tokens, learning_rate, reply.metrics)
        await self._store.add(model_id, point)
