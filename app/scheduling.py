"""Per-model ordering: operations run strictly in seq_id order, and consecutive ready operations of a
model leave together in one batch.

A submit never waits for earlier seq_ids to arrive (the SDK sends the chunks of one forward_backward
concurrently and out of order); it only waits for its own result.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Generic, TypeVar

from app.errors import UserError

Op = TypeVar("Op")


@dataclass
class _ModelQueue(Generic[Op]):
    next_seq: int
    waiting: dict[int, tuple[Op, asyncio.Future]] = field(default_factory=dict)
    draining: bool = False


class SeqScheduler(Generic[Op]):
    """`run_batch(model_id, ops)` executes ops in order and returns one result per op."""

    def __init__(self, run_batch: Callable[[str, list[Op]], Awaitable[list[Any]]], *, max_batch: int = 64) -> None:
        self._run_batch = run_batch
        self._max_batch = max_batch
        self._queues: dict[str, _ModelQueue[Op]] = {}
        self._drains: set[asyncio.Task] = set()  # strong references: the loop keeps only weak ones

    def open(self, model_id: str, next_seq: int = 1) -> None:
        self._queues.setdefault(model_id, _ModelQueue(next_seq))

    def close(self, model_id: str, reason: Exception) -> None:
        """Forget a model; its queued operations fail with `reason`."""
        queue = self._queues.pop(model_id, None)
        for _, fut in (queue.waiting.values() if queue else []):
            if not fut.done():
                fut.set_exception(reason)

    def is_open(self, model_id: str) -> bool:
        return model_id in self._queues

    async def submit(self, model_id: str, seq_id: int, op: Op) -> Any:
        queue = self._queues.get(model_id)
        if queue is None:
            raise UserError(f"model {model_id!r} is not loaded on this trainer", field="model_id")
        if seq_id < queue.next_seq or seq_id in queue.waiting:
            raise UserError(f"seq_id {seq_id} of model {model_id!r} was already submitted", field="seq_id")
        fut = asyncio.get_running_loop().create_future()
        queue.waiting[seq_id] = (op, fut)
        if not queue.draining:
            queue.draining = True
            task = asyncio.create_task(self._drain(model_id, queue))
            self._drains.add(task)
            task.add_done_callback(self._drains.discard)
        return await fut

    async def _drain(self, model_id: str, queue: _ModelQueue[Op]) -> None:
        try:
            while queue.next_seq in queue.waiting:
                run: list[tuple[Op, asyncio.Future]] = []
                while queue.next_seq in queue.waiting and len(run) < self._max_batch:
                    run.append(queue.waiting.pop(queue.next_seq))
                    queue.next_seq += 1
                try:
                    results = await self._run_batch(model_id, [op for op, _ in run])
                    if len(results) != len(run):
                        raise RuntimeError(f"run_batch returned {len(results)} results for {len(run)} operations")
                except Exception as exc:  # noqa: BLE001 - every op of the batch learns why
                    results = [exc] * len(run)
                for (_, fut), result in zip(run, results):
                    if fut.done():
                        continue
                    if isinstance(result, Exception):
                        fut.set_exception(result)
                    else:
                        fut.set_result(result)
        finally:
            queue.draining = False
