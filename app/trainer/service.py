"""One trainer (of a base model, for policies and/or critics): ordered per-model queues feeding one worker group.

It owns execution end to end: it runs operations in seq_id order, merges the ranks' outputs and
writes each future's outcome to the store, so results survive an ingress restart.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Collection, Sequence
from dataclasses import dataclass, field

from app.config import EngineConfig, MetricsConfig, TimeoutsConfig, WorkerGroupConfig
from app.db.checkpoints import CheckpointStore
from app.db.futures import FutureStore
from app.db.history import HistoryStore
from app.db.journal import JournalStore
from app.db.metadata import MetadataStore
from app.errors import GroupRestarted, LimitExceeded, ServerError, TinkerServeError
from app.messages import (
    RankReply,
    RemoveModelCommand,
    Replies,
    SequencedOp,
    ShardOutput,
    Skip,
    WorkerCommand,
)
from app.metrics import LabelValues, QueueDepths, server_metrics
from app.operations import CheckpointCommitter, Reply, changes_model, fair_share_cost, operation
from app.operations.create_model import CreateModel
from app.request_log import log_request, outcome_of
from app.storage.objects import ObjectStorage
from app.trainer.history import HistoryRecorder
from app.trainer.in_flight import InFlight
from app.trainer.memory_refusal import memory_refusal
from app.trainer.mixing import MixPolicy, mixed_message
from app.trainer.pass_sizing import PassSizing
from app.trainer.rank_replies import first_error, first_failed_command
from app.trainer.recovery import (
    PlannedSnapshot,
    SnapshotPolicy,
    Takeover,
    creation_commands,
    rebuild_all,
    record_snapshot,
    run_commands,
    unfinished,
)
from app.trainer.scheduling import AlreadySubmitted, SeqScheduler
from app.trainer.single_flight import SingleFlight
from app.trainer.worker_deaths import WorkerDeaths
from app.trainer.worker_group import WorkerGroup

logger = logging.getLogger("tinker_serve.trainer")
Queued = tuple[int, SequencedOp]  # (seq_id, op)


@dataclass(frozen=True)
class _PlannedRun:
    """A run of one model's ops as dispatched: its length (Skips included), the ops that run, the snapshot planned
    after them, and their commands."""

    model_id: str
    length: int
    work: list[Queued]
    snapshot: PlannedSnapshot | None
    commands: list[WorkerCommand]


_REBUILD_ATTEMPTS = 3  # restarts of the group while its models are being rebuilt, before they are given up


@dataclass(frozen=True)
class TrainerDeps:
    """What a TrainerService runs on: its worker group, the stores it writes, the blob storage, and its settings.
    `shape`: the worker group's config: the fair share's dispatch depth and op cost, the snapshot policy. `sizing`:
    what an operation asks of a rank's memory on this group and base (app.trainer.pass_sizing, of the same shape); by
    default the shape's without the base's config.json: datums run whole, nothing is estimated. `metrics`: whether
    the queue-depth metric names each model (by default its models are summed)."""

    group: WorkerGroup
    futures: FutureStore
    metadata: MetadataStore
    checkpoints: CheckpointStore
    storage: ObjectStorage
    journal: JournalStore
    history: HistoryStore
    timeouts: TimeoutsConfig = field(default_factory=TimeoutsConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    shape: WorkerGroupConfig = field(default_factory=WorkerGroupConfig)
    sizing: PassSizing | None = None
    metrics: MetricsConfig = field(default_factory=MetricsConfig)


class TrainerService:
    def __init__(self, name: str, deps: TrainerDeps) -> None:
        shape, group = deps.shape, deps.group
        self._sizing = deps.sizing or PassSizing.of(shape, group.world_size, None)
        self.name = name
        self._queue_depths = QueueDepths(name, LabelValues.models(deps.metrics))
        self._metadata = deps.metadata
        self._journal = deps.journal
        self._history = HistoryRecorder(deps.history)
        self._storage = deps.storage
        self._snapshots = SnapshotPolicy(shape.snapshot_every_steps, shape.snapshot_every_seconds)
        self._committer = CheckpointCommitter(deps.checkpoints, deps.storage)
        self._max_models = deps.engine.max_models_per_base
        self._deaths = WorkerDeaths(deps.journal, deps.futures, deps.timeouts, self._sizing)
        self._group = group
        self._futures = deps.futures
        self._fixed_op_cost = shape.fixed_op_cost_tokens
        self._mix_policy = MixPolicy(shape, group.world_size)
        self._scheduler: SeqScheduler[Queued] = SeqScheduler(
            self._dispatch,
            gap_timeout_s=deps.timeouts.seq_gap_timeout_seconds,
            max_dispatched_runs=shape.max_dispatched_runs,
            cost=self._cost,
            extra_credit=shape.fixed_op_cost_tokens,  # an optim_step leaves with its forward_backward
            mixes=self._mixes,
        )
        self._models: set[str] = set()
        self._in_flight = InFlight()  # runs sent and not answered, operations sent and not written: what recovery needs
        self._writes: set[asyncio.Task] = set()  # runs' outcomes being written (strong references)
        self._recovery: asyncio.Task | None = None
        self._resumed: set[asyncio.Task] = set()  # journaled operations rerun after a trainer restart
        self._single_flight = SingleFlight()  # creates and submits by request id: a repeated call waits
        self._stopping = False  # from stop() on, nothing is sent and no future is failed: the next trainer reruns them
        self._down_for_good = False  # the group's run ended (check_health): its last death is charged

    async def start(self) -> None:
        """Start the workers, then (in the background) rebuild the models this trainer held before it restarted,
        from their snapshots and journals, and rerun their operations that never finished. Until a model is
        rebuilt its operations wait; if it cannot be, they fail with the reason. Models still being created (a
        client may create one while this trainer starts) are created."""
        await self._group.start()
        unfinished_ops: dict[str, list[tuple[int, SequencedOp]]] = {}
        for model_id in await self._metadata.live_model_ids_on(self.name):
            queued = await self._resume(model_id)
            if queued is not None:
                unfinished_ops[model_id] = queued
        if not self._models:
            return
        self._start_recovery()  # before anything is queued: dispatches wait for the rebuild from here on
        for model_id, queued in unfinished_ops.items():
            for seq_id, op in queued:
                self._in_background(self.submit(model_id, seq_id, op))
        rerun = sum(operation(op).traits.runs for queued in unfinished_ops.values() for _, op in queued)
        logger.info(
            "trainer %s: rebuilding %d models; %d unfinished operations rerun", self.name, len(self._models), rerun
        )

    async def _resume(self, model_id: str) -> list[tuple[int, SequencedOp]] | None:
        """Take over a model of the previous incarnation (the recovery rebuilds it): its queue opens where its
        journal says; returns its journaled operations that never finished, to queue again in order. A model still
        being created is created (again: the ingress's call may follow, and creating is idempotent), and None."""
        plan = await unfinished(self._journal, model_id, self._deaths.limit)
        if not isinstance(plan, Takeover):
            if plan is not None:
                self._in_background(self.create_model(model_id, plan))
            logger.info("trainer %s: model %s is still being created", self.name, model_id)
            return None
        for entry in plan.given_up:
            await self._deaths.give_up(model_id, entry.op, entry.worker_deaths)
        self._models.add(model_id)
        await self._history.resume(model_id)
        self._scheduler.open(model_id, next_seq=plan.next_seq)
        return plan.queued

    def _in_background(self, work: Awaitable[None]) -> None:  # rerun journaled work; the task is kept until it ends
        task = asyncio.ensure_future(work)
        self._resumed.add(task)
        task.add_done_callback(self._resumed.discard)

    async def check_health(self) -> None:
        """Raise when the worker group is down for good (Ray Train gave up restarting it; Serve then replaces this
        replica). That last death is charged first, once, to the operations the ranks were running: the trainer that
        starts next gives up on those at their limit instead of rerunning them into the same death."""
        try:
            self._group.check_health()
        except Exception:
            if not self._down_for_good:
                self._down_for_good = True
                await self._in_flight.charge(self._deaths, await self._group.running())
            raise

    async def stop(self) -> None:
        """End the workers' loops, so Ray Train ends the run and releases its placement group. Runs not answered
        by then are left to the trainer that starts next (their futures stay pending, their journal reruns them)."""
        self._stopping = True
        await self._group.stop()

    async def worker_pids(self) -> list[int]:
        """The process id of each rank, in rank order."""
        return await self._group.pids()

    async def create_model(self, model_id: str, create: CreateModel) -> None:
        """Create the model (seq_id 0), and with `create.load` fill it from a checkpoint in the same step. Asked
        again (created at start, then by the ingress's own call), it waits for the first."""
        await self._single_flight.run(create.request_id, lambda: self._create(model_id, create))

    async def _create(self, model_id: str, create: CreateModel) -> None:
        if model_id in self._models:
            return
        try:
            if len(self._models) >= self._max_models:
                raise LimitExceeded(
                    f"trainer {self.name} already holds engine.max_models_per_base="
                    f"{self._max_models} models; unload one first",
                    field="base_model",
                )
            replies = await self._group.call(creation_commands(model_id, create))
            failed = first_failed_command(replies)
            if failed is not None:
                await self._group.call([RemoveModelCommand(model_id)])
                await self._futures.fail(create.request_id, failed[1])
                return
            reply = await operation(create).reply(model_id, create, [r[-1] for r in replies], self._committer)
        except TinkerServeError as exc:
            await self._futures.fail(create.request_id, exc.to_body())
            return
        self._models.add(model_id)
        self._scheduler.open(model_id, next_seq=1)
        await self._futures.complete(create.request_id, reply.payload, reply.content_type)

    async def unload_model(self, request_id: str, model_id: str) -> None:
        self._scheduler.close(model_id, ServerError(f"model {model_id!r} was unloaded"))
        self._queue_depths.set(model_id, 0)
        self._models.discard(model_id)
        self._snapshots.forget(model_id)
        await self._group.call([RemoveModelCommand(model_id)])
        for location in await self._journal.forget(model_id):
            await asyncio.to_thread(self._storage.delete, location)
        reply = Reply.json({"model_id": model_id, "type": "unload_model"})
        await self._futures.complete(request_id, reply.payload, reply.content_type)

    async def submit(self, model_id: str, seq_id: int, op: SequencedOp, user: str = "") -> None:
        """Queue `user`'s `op`; returns once its future is written (success or failure). The same request again
        (Serve delivers a call the previous replica never answered after this one reran it from the journal)
        waits for the first."""
        await self._single_flight.run(op.request_id, lambda: self._queue(model_id, seq_id, op, user))

    async def _queue(self, model_id: str, seq_id: int, op: SequencedOp, user: str) -> None:
        refused = memory_refusal(op, self._sizing)
        if refused is not None:  # it fails now, and its seq_id runs as a Skip: the model's order goes on
            await self._futures.fail(op.request_id, refused.to_body())
            log_request(
                "refused",
                op=operation(op).name(op),
                model_id=model_id,
                seq_id=seq_id,
                tinker_request_id=op.request_id,
                outcome="user_error",
            )
            op = Skip(op.request_id)
        try:
            written = await self._scheduler.submit(model_id, seq_id, (seq_id, op), user)
            await written
        except AlreadySubmitted:
            return  # handed over again after a client retry: the first hand-over writes its future
        except TinkerServeError as exc:
            await self._futures.fail_if_pending(op.request_id, exc.to_body())

    def missing(self, model_id: str, seq_ids: list[int]) -> list[int]:
        """Of these seq_ids of the model, those this trainer never received (its ingress died before handing them
        over): the ingress hands them over again (app.api.handover)."""
        return self._scheduler.unknown(model_id, seq_ids)

    async def cancel(self, model_id: str, seq_id: int, request_id: str) -> None:
        """A cancelled operation (its future already failed) never runs if it has not started; one that runs
        finishes and its outcome is discarded. Later seq_ids go on either way."""
        skipped = self._scheduler.cancel(model_id, seq_id, (seq_id, Skip(request_id)))  # it had not started
        if skipped or not self._in_flight.cancel(request_id):
            return
        dropped = await self._group.cancel(request_id)
        log_request(
            "cancelled",
            op="cancel",
            model_id=model_id,
            seq_id=seq_id,
            tinker_request_id=request_id,
            outcome="dropped" if dropped else "running",
        )

    def _mixes(self, heads: list[Queued]) -> bool:
        """Whether ops at the heads of distinct models' queues run as one pass (app.trainer.mixing)."""
        return self._mix_policy([op for _, op in heads])

    def _cost(self, queued: Queued) -> int:
        """An op's cost in the fair share (its operation's `cost`)."""
        return fair_share_cost(queued[1], self._fixed_op_cost)

    def _dispatch(self, runs: list[tuple[str, list[Queued]]]) -> Awaitable[list[Awaitable[None]]]:
        """Send the runs (one model's consecutive ops each; several when they mix: app.trainer.mixing) to the workers
        as one message now (order matters; while the group is being recovered, the recovery sends it); the returned
        awaitable is done when the workers answer (which frees the dispatch slot), with, for each op, the writing of
        its run's futures to await."""
        planned = [self._plan(model_id, run) for model_id, run in runs]
        message, positions = mixed_message([p.commands for p in planned])
        send = self._group.send if self._recovery is None and not self._stopping else None
        number = self._in_flight.dispatch(message, send, ((p.model_id, op) for p in planned for _, op in p.work))
        for p in planned:
            self._queue_depths.set(p.model_id, self._scheduler.waiting(p.model_id))
        return self._replies(planned, positions, number)

    def _plan(self, model_id: str, run: list[Queued]) -> _PlannedRun:
        work = [(seq_id, op) for seq_id, op in run if operation(op).traits.runs]
        snapshot = self._snapshots.plan(model_id, [seq_id for seq_id, _ in work], [op for _, op in work])
        return _PlannedRun(model_id, len(run), work, snapshot, run_commands(model_id, [op for _, op in work], snapshot))

    async def _replies(
        self, planned: list[_PlannedRun], positions: list[list[int]], number: int
    ) -> list[Awaitable[None]]:
        started = time.monotonic()
        try:
            replies = await self._answers(number) if self._in_flight.has_message(number) else []
        except Exception:
            self._in_flight.abandon({op.request_id for p in planned for _, op in p.work})
            raise
        finally:
            self._in_flight.answered(number)
        seconds = time.monotonic() - started
        writes: list[Awaitable[None]] = []
        for p, where in zip(planned, positions, strict=True):
            own = [[rank_replies[i] for i in where] for rank_replies in replies]
            if p.snapshot is not None:
                own = [r[: p.snapshot.index] + r[p.snapshot.index + 1 :] for r in own]
                await record_snapshot(self._journal, self._storage, self.name, p.model_id, p.snapshot, seconds)
            task = asyncio.create_task(self._write_outcomes(p.model_id, p.work, own, seconds))
            self._writes.add(task)
            task.add_done_callback(self._writes.discard)
            writes += [task] * p.length
        return writes

    async def _answers(self, number: int) -> Replies:
        """The replies to run `number`: through any restarts of the group, after which the recovery resends it."""
        while True:
            pending, generation = self._in_flight.take_sending(number)
            if pending is not None:
                try:
                    return await pending
                except GroupRestarted as exc:
                    if generation == self._in_flight.generation:  # no recovery since this was sent: start one
                        self._start_recovery(exc.running)
                except Exception:
                    if not self._stopping:
                        raise
            if self._stopping:  # never answered here: the next trainer reruns it
                await asyncio.get_running_loop().create_future()
            if self._recovery is not None:
                await asyncio.shield(self._recovery)

    def _start_recovery(self, running: Collection[str] = ()) -> None:
        self._recovery = asyncio.create_task(self._recover(self._in_flight.new_generation(), running))

    async def _recover(self, generation: int, running: Collection[str]) -> None:
        """Charge the death to the operations that were `running`, rebuild every model on the restarted workers, then
        resend the unanswered runs in their order (less what was given up). Models that cannot be rebuilt are closed
        with the reason; if the group does not come back, all of them."""
        started = time.monotonic()
        replayed = 0
        try:
            logger.warning("trainer %s: its workers are new; rebuilding %d models", self.name, len(self._models))
            await self._in_flight.charge(self._deaths, running)
            await asyncio.gather(*self._writes, return_exceptions=True)  # what finished is in the journal's states
            for attempt in range(1, _REBUILD_ATTEMPTS + 1):
                await self._group.wait_ready()
                try:
                    replayed += await rebuild_all(self._group, self._journal, self._models, self._lose_model)
                    break
                except GroupRestarted:  # again, while rebuilding
                    if attempt == _REBUILD_ATTEMPTS:
                        raise
        except Exception as exc:
            for model_id in list(self._models):
                self._lose_model(model_id, exc)
            raise
        finally:
            self._in_flight.resend(self._group, generation)
            self._recovery = None
        seconds = time.monotonic() - started
        server_metrics().recoveries.observe(seconds, tags={"trainer": self.name})
        if replayed:  # Ray's counters take no 0
            server_metrics().replayed_ops.inc(replayed, tags={"trainer": self.name})
        logger.warning(
            "trainer %s rebuilt %d models in %.1f s (%d operations replayed)",
            self.name,
            len(self._models),
            seconds,
            replayed,
        )

    async def _write_outcomes(self, model_id: str, work: Sequence[Queued], replies: Replies, seconds: float) -> None:
        self._record([op for _, op in work], seconds)
        for i, (seq_id, op) in enumerate(work):
            if not self._in_flight.finish(op.request_id):  # cancelled: its future says so already
                continue
            try:
                error = await self._write_outcome(model_id, seq_id, op, [rank_replies[i] for rank_replies in replies])
            except TinkerServeError as exc:
                error = exc.to_body()
                await self._futures.fail(op.request_id, error)
            log_request(
                "ran",
                op=operation(op).name(op),
                model_id=model_id,
                seq_id=seq_id,
                tinker_request_id=op.request_id,
                outcome=outcome_of(error),
                run_seconds=round(seconds, 4),
                run_ops=len(work),
            )

    async def _write_outcome(
        self, model_id: str, seq_id: int, op: SequencedOp, per_rank: list[RankReply]
    ) -> dict | None:
        """Complete the op's future with its reply (a step goes into the run's history), or fail it with the first
        rank's error (returned)."""
        error = first_error(per_rank)
        if error is not None:
            await self._futures.fail(op.request_id, error)
            return error
        reply = await operation(op).reply(model_id, op, per_rank, self._committer)
        self._scheduler.debit(model_id, reply.cost_tokens)  # a custom loss's compute, beyond the tokens charged
        writes = [
            self._futures.complete(op.request_id, reply.payload, reply.content_type),
            self._history.record(model_id, seq_id, op, reply),
        ]
        layout = per_rank[0].layout if isinstance(per_rank[0], ShardOutput) else None
        if layout is not None and changes_model(op):  # what replays it bit for bit in a rebuild
            writes.append(self._journal.record_layout(model_id, seq_id, layout))
        await asyncio.gather(*writes)  # one commit (group_commit)
        return None

    def _record(self, work: list[SequencedOp], seconds: float) -> None:
        metrics = server_metrics()
        for op in work:
            kind = operation(op)
            metrics.op_seconds.observe(seconds, tags={"trainer": self.name, "op": kind.name(op)})
            if trained := kind.trained_tokens(op):
                metrics.tokens.inc(trained, tags={"name": self.name, "kind": "trained"})

    def _lose_model(self, model_id: str, reason: Exception) -> None:
        logger.error("model %s on trainer %s is lost: %s", model_id, self.name, reason)
        self._scheduler.close(model_id, reason)
        self._queue_depths.set(model_id, 0)
        self._models.discard(model_id)
