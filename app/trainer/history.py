"""What the trainer records of each finished training step for the run's history (app.db.history)."""

from __future__ import annotations

import time

from app.db.history import HistoryPoint, HistoryStore
from app.messages import SequencedOp
from app.operations import Reply, operation


class HistoryRecorder:
    def __init__(self, store: HistoryStore) -> None:
        self._store = store
        self._steps: dict[str, int] = {}  # model_id -> optim_steps finished

    async def resume(self, model_id: str) -> None:
        """Count a model's steps on from its history (a new model has none)."""
        self._steps[model_id] = await self._store.steps_done(model_id)

    async def record(self, model_id: str, seq_id: int, op: SequencedOp, reply: Reply) -> None:
        """Record the outcome of `op` (an operation that ran: never a Skip) if it is a training step (its operation's
        `history`: forward, forward_backward or optim_step) that returned metrics."""
        if reply.metrics is None:
            return
        kind = operation(op)
        entry = kind.history(op)
        if entry is None:
            return
        step = self._steps.get(model_id, 0) + entry.finishes_step
        self._steps[model_id] = step
        point = HistoryPoint(seq_id, kind.name(op), time.time(), step, entry.tokens, entry.learning_rate, reply.metrics)
        await self._store.add(model_id, point)
