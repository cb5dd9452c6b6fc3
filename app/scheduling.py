"""Per-model ordering: operations are dispatched strictly in seq_id order; the seq_ids that are ready
together leave together in one batch.

A submit never waits for earlier seq_ids to arrive (the SDK sends the chunks of one forward_backward
concurrently and out of order); it only waits for its own result. Dispatch is pipelined: a run is sent
as soon as it is ready, without waiting for earlier runs to finish, because the worker group executes
messages in the order they were sent (this hides the command round trip behind the previous command).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Generic, TypeVar

from app.errors import UserError

Op = TypeVar("Op")

# dispatch(model_id, ops) must send `ops` before it returns, and give back an awaitable of one result
# (or exception) per op.
Dispatch = Callable[[str, list[Op]], Awaitable[list[Any]]]


@dataclass
class _ModelQueue(Generic[Op]):
    next_seq: int
    waiting: dict[int, tuple[Op, asyncio.Future]] = field(default_factory=dict)


class SeqScheduler(Generic[Op]):
    def __init__(self, dispatch: Dispatch, *, max_batch: int = 64) -> None:
        self._dispatch = dispatch
        self._max_batch = max_batch
        self._queues: dict[str, _ModelQueue[Op]] = {}
        self._in_flight: set[asyncio.Task] = set()  # strong references: the loop keeps only weak ones

    def open(self, model_id: str, next_seq: int = 1) -> None:
        self._queues.setdefault(model_id, _ModelQueue(next_seq))

    def close(self, model_id: str, reason: Exception) -> None:
        """Forget a model; its operations still waiting for their turn fail with `reason`."""
        queue = self._queues.pop(model_id, None)
        for _, fut in (queue.waiting.values() if queue else []):
            if not fut.done():
                fut.set_exception(reason)

    def is_open(self, model_id: str) -> bool:
        return model_id in self._queues

    async def submit(self, model_id: str, seq_id: int, op: Op) -> Any:
        queue = self._queues.get(model_id)
        if queue is None:
            raise UserError(f"model {model_id!r} is not loaded on this trainer (unloaded, or lost when the trainer "
                            "restarted): create it again or load a checkpoint", field="model_id")
        if seq_id < queue.next_seq or seq_id in queue.waiting:
            raise UserError(f"seq_id {seq_id} of model {model_id!r} was already submitted", field="seq_id")
        fut = asyncio.get_running_loop().create_future()
        queue.waiting[seq_id] = (op, fut)
        self._dispatch_ready(model_id, queue)
        return await fut

    def _dispatch_ready(self, model_id: str, queue: _ModelQueue[Op]) -> None:
        while queue.next_seq in queue.waiting:
            run: list[tuple[Op, asyncio.Future]] = []
            while queue.next_seq in queue.waiting and len(run) < self._max_batch:
                run.append(queue.waiting.pop(queue.next_seq))
                queue.next_seq += 1
            try:
                pending = self._dispatch(model_id, [op for op, _ in run])
            except Exception as exc:  # noqa: BLE001 - every op of the run learns why
                self._resolve(run, [exc] * len(run))
                continue
            task = asyncio.ensure_future(self._settle(pending, run))
            self._in_flight.add(task)
            task.add_done_callback(self._in_flight.discard)

    async def _settle(self, pending: Awaitable[list[Any]], run: list[tuple[Op, asyncio.Future]]) -> None:
        try:
            results = await pending
            if len(results) != len(run):
                raise RuntimeError(f"dispatch returned {len(results)} results for {len(run)} operations")
        except Exception as exc:  # noqa: BLE001 - every op of the run learns why
            results = [exc] * len(run)
        self._resolve(run, results)

    @staticmethod
    def _resolve(run: list[tuple[Op, asyncio.Future]], results: list[Any]) -> None:
        for (_, fut), result in zip(run, results):
            if fut.done():
                continue
            if isinstance(result, Exception):
                fut.set_exception(result)
            else:
                fut.set_result(result)
