"""Per-model ordering, fair across users: each model's operations are dispatched strictly in seq_id order, in
runs of consecutive ready seq_ids; which model's run goes next is chosen fairly across users (app.trainer.fair_share).

A submit never waits for earlier seq_ids to arrive (the SDK sends the chunks of one forward_backward
concurrently and out of order); it only waits for its own result. Dispatch is pipelined: up to
`max_dispatched_runs` runs are at the worker group at once, without waiting for earlier runs to finish, because
the worker group executes messages in the order they were sent (this hides the command round trip behind the
previous command). Keeping that depth small is what makes the order fair: the rest wait here, where a user who
arrives later can still go ahead of a flooder's queue.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from app.errors import UserError
from app.trainer.fair_share import FairShare

Op = TypeVar("Op")
logger = logging.getLogger("tinker_serve.scheduling")

# dispatch([(model_id, ops), ...]) must send the runs (one model's consecutive ops each) before it returns, and give
# back an awaitable of one result (or exception) per op, in order; the runs hold one dispatch slot until it is done.
Dispatch = Callable[[list[tuple[str, list[Op]]]], Awaitable[list[Any]]]
Cost = Callable[[Op], int]  # an operation's cost in the fair share (tokens)
Mixes = Callable[[list[Op]], bool]  # whether ops at the heads of distinct models' queues may run as one pass


@dataclass
class _ModelQueue(Generic[Op]):
    next_seq: int
    user: str = ""  # whose model it is (the last submit says)
    waiting: dict[int, tuple[Op, asyncio.Future]] = field(default_factory=dict)
    cancelled: dict[int, Op] = field(default_factory=dict)  # seq_id -> what runs instead, once it arrives
    gap_watch: tuple[int, asyncio.TimerHandle] | None = None  # (the missing seq_id, its timer)
    given_up: list[range] = field(default_factory=list)  # seq_ids skipped after the gap timeout: stragglers are refused


class AlreadySubmitted(Exception):
    """The seq_id is waiting or was dispatched already: a repeat of the same operation (an ingress that handed it
    over again after a retry), which changes nothing."""


class SeqScheduler(Generic[Op]):
    def __init__(
        self,
        dispatch: Dispatch,
        *,
        max_batch: int = 64,
        gap_timeout_s: float = 330.0,
        max_dispatched_runs: int | None = None,
        cost: Cost | None = None,
        extra_credit: int = 0,
        mixes: Mixes | None = None,
    ) -> None:
        """`gap_timeout_s`: how long operations wait for a missing earlier seq_id before it is skipped
        (a submit rejected before its seq_id could be read never arrives; the SDK retries a submit for
        up to 300 s, so the default waits longer than that). `max_dispatched_runs`: runs at the worker group at
        once (None: every run is sent as soon as it is ready, in arrival order). `cost`: each op's cost in the fair
        share (default 0: a ready run leaves whole, up to `max_batch`); `extra_credit`: see app.trainer.fair_share.
        `mixes`: when given, a run whose first op mixes is dispatched together with the runs of other models whose
        first ops mix with it (one dispatch slot, one pass on the workers), each chosen and charged by the fair share
        as if it went alone."""
        self._dispatch = dispatch
        self._max_batch = max_batch
        self._gap_timeout_s = gap_timeout_s
        self._max_dispatched = max_dispatched_runs
        self._cost: Cost = cost or (lambda _: 0)
        self._mixes = mixes
        self._fair = FairShare(extra_credit)
        self._dispatched = 0  # runs sent whose awaitable is not done
        self._queues: dict[str, _ModelQueue[Op]] = {}
        self._in_flight: set[asyncio.Task] = set()  # strong references: the loop keeps only weak ones

    def open(self, model_id: str, next_seq: int = 1) -> None:
        self._queues.setdefault(model_id, _ModelQueue(next_seq))

    def close(self, model_id: str, reason: Exception) -> None:
        """Forget a model; its operations still waiting for their turn fail with `reason`."""
        queue = self._queues.pop(model_id, None)
        if queue is not None:
            self._fair.forget(queue.user, model_id)
        if queue is not None and queue.gap_watch is not None:
            queue.gap_watch[1].cancel()
        for _, fut in queue.waiting.values() if queue else []:
            if not fut.done():
                fut.set_exception(reason)

    def cancel(self, model_id: str, seq_id: int, skipped: Op) -> bool:
        """Put `skipped` in the place of a model's operation not dispatched yet (waiting, or still to arrive), so
        the order goes on without it; False when it was dispatched already (or the model is not here)."""
        queue = self._queues.get(model_id)
        if queue is None or seq_id < queue.next_seq:
            return False
        if seq_id in queue.waiting:
            queue.waiting[seq_id] = (skipped, queue.waiting[seq_id][1])
        else:
            queue.cancelled[seq_id] = skipped
        return True

    def debit(self, model_id: str, tokens: int) -> None:
        """Charge the user of `model_id` `tokens` more in the fair share (app.trainer.fair_share.FairShare.debit)."""
        queue = self._queues.get(model_id)
        if queue is not None and tokens > 0:
            self._fair.debit(queue.user, tokens)

    def unknown(self, model_id: str, seq_ids: list[int]) -> list[int]:
        """Of these seq_ids of an open model, those never submitted here (not waiting, not dispatched, not given up);
        none for a model that is not open here."""
        queue = self._queues.get(model_id)
        if queue is None:
            return []
        return [
            seq_id
            for seq_id in seq_ids
            if seq_id >= queue.next_seq
            and seq_id not in queue.waiting
            and seq_id not in queue.cancelled
            and not any(seq_id in skipped for skipped in queue.given_up)
        ]

    def waiting(self, model_id: str) -> int:
        """The model's operations submitted and not yet dispatched."""
        queue = self._queues.get(model_id)
        return len(queue.waiting) if queue else 0

    async def submit(self, model_id: str, seq_id: int, op: Op, user: str = "") -> Any:
        """Queue `user`'s `op`; returns its result (or raises its exception) once its run is done."""
        queue = self._queues.get(model_id)
        if queue is None:
            raise UserError(
                f"model {model_id!r} is not loaded on this trainer (unloaded, or lost when the trainer "
                "restarted): create it again or load a checkpoint",
                field="model_id",
            )
        if any(seq_id in skipped for skipped in queue.given_up):
            raise UserError(
                f"seq_id {seq_id} of model {model_id!r} arrived after later operations had waited "
                "timeouts.seq_gap_timeout_seconds for it",
                field="seq_id",
            )
        if seq_id < queue.next_seq or seq_id in queue.waiting:
            raise AlreadySubmitted(f"seq_id {seq_id} of model {model_id!r}")
        if queue.user != user:
            self._fair.forget(queue.user, model_id)
            queue.user = user
        fut = asyncio.get_running_loop().create_future()
        queue.waiting[seq_id] = (queue.cancelled.pop(seq_id, op), fut)
        self._watch_gap(model_id, queue)
        self._pump()
        return await fut

    def _pump(self) -> None:
        """Send ready runs while a dispatch slot is free, the next one chosen fairly across users (and the runs that
        mix with it, chosen the same way)."""
        while self._max_dispatched is None or self._dispatched < self._max_dispatched:
            ready = self._ready()
            if not ready:
                return
            runs = [self._next_run(ready)]
            while self._mixes is not None and (ready := self._ready()):
                heads = [run[0][0] for _, run in runs]
                taken = {model_id for model_id, _ in runs}
                among = {
                    user: joining
                    for user, models in ready.items()
                    if (joining := [m for m in models if m not in taken and self._mixes([*heads, self._head(m)])])
                }
                if not among:
                    break
                runs.append(self._next_run(ready, among))
            self._send(runs)

    def _ready(self) -> dict[str, list[str]]:
        """Each user's models whose next operation is ready."""
        ready: dict[str, list[str]] = {}
        for model_id, queue in self._queues.items():
            if queue.next_seq in queue.waiting:
                ready.setdefault(queue.user, []).append(model_id)
        return ready

    def _next_run(
        self, ready: dict[str, list[str]], among: dict[str, list[str]] | None = None
    ) -> tuple[str, list[tuple[Op, asyncio.Future]]]:
        """The fair share's next model (of `among`, when given) and its run, charged."""
        user, model_id, credit = self._fair.pick(ready, self._head_cost, among)
        queue = self._queues[model_id]
        run, spent = self._take_run(queue, credit)
        self._fair.charge(user, model_id, spent)
        self._watch_gap(model_id, queue)
        return model_id, run

    def _head(self, model_id: str) -> Op:
        queue = self._queues[model_id]
        return queue.waiting[queue.next_seq][0]

    def _head_cost(self, model_id: str) -> int:
        return self._cost(self._head(model_id))

    def _take_run(self, queue: _ModelQueue[Op], credit: int) -> tuple[list[tuple[Op, asyncio.Future]], int]:
        """The model's next consecutive ready ops, at least one, as many as `credit` and `max_batch` allow; and
        their cost."""
        run: list[tuple[Op, asyncio.Future]] = []
        spent = 0
        while queue.next_seq in queue.waiting and len(run) < self._max_batch:
            cost = self._cost(queue.waiting[queue.next_seq][0])
            if run and spent + cost > credit:
                break
            run.append(queue.waiting.pop(queue.next_seq))
            queue.next_seq += 1
            spent += cost
        return run, spent

    def _send(self, runs: list[tuple[str, list[tuple[Op, asyncio.Future]]]]) -> None:
        ops = [op for _, run in runs for op in run]
        try:
            pending = self._dispatch([(model_id, [op for op, _ in run]) for model_id, run in runs])
        except Exception as exc:  # noqa: BLE001 - every op of the runs learns why
            self._resolve(ops, [exc] * len(ops))
            return
        self._dispatched += 1
        task = asyncio.ensure_future(self._settle(pending, ops))
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)

    def _watch_gap(self, model_id: str, queue: _ModelQueue[Op]) -> None:
        """Operations wait behind a missing seq_id: one timer per missing seq_id skips it if it never fills.
        (Ready operations waiting for a dispatch slot wait behind nothing missing.)"""
        missing = bool(queue.waiting) and queue.next_seq not in queue.waiting
        if queue.gap_watch is not None and (not missing or queue.gap_watch[0] != queue.next_seq):
            queue.gap_watch[1].cancel()
            queue.gap_watch = None
        if missing and queue.gap_watch is None:
            expected = queue.next_seq
            timer = asyncio.get_running_loop().call_later(
                self._gap_timeout_s, self._skip_gap, model_id, queue, expected
            )
            queue.gap_watch = (expected, timer)

    def _skip_gap(self, model_id: str, queue: _ModelQueue[Op], expected: int) -> None:
        queue.gap_watch = None
        if self._queues.get(model_id) is not queue or queue.next_seq != expected or not queue.waiting:
            return
        first = min(queue.waiting)
        logger.warning(
            "model %s: seq_id %d..%d never arrived within %.0f s; running the %d operations waiting behind them",
            model_id,
            expected,
            first - 1,
            self._gap_timeout_s,
            len(queue.waiting),
        )
        queue.given_up.append(range(expected, first))
        queue.next_seq = first
        queue.cancelled = {seq: op for seq, op in queue.cancelled.items() if seq > first}
        self._watch_gap(model_id, queue)
        self._pump()

    async def _settle(self, pending: Awaitable[list[Any]], run: list[tuple[Op, asyncio.Future]]) -> None:
        try:
            results = await pending
            if len(results) != len(run):
                raise RuntimeError(f"dispatch returned {len(results)} results for {len(run)} operations")
        except Exception as exc:  # noqa: BLE001 - every op of the run learns why
            results = [exc] * len(run)
        finally:
            self._dispatched -= 1
        self._resolve(run, results)
        self._pump()

    @staticmethod
    def _resolve(run: list[tuple[Op, asyncio.Future]], results: list[Any]) -> None:
        for (_, fut), result in zip(run, results):
            if fut.done():
                continue
            if isinstance(result, Exception):
                fut.set_exception(result)
            else:
                fut.set_result(result)
