"""One trainer (of a base model, for policies and/or critics): ordered per-model queues feeding one worker group.

It owns execution end to end: it runs operations in seq_id order, merges the ranks' outputs and
writes each future's outcome to the store, so results survive an ingress restart.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, replace
from typing import Awaitable, Union

from app.config import LimitsConfig
from app.errors import GroupRestarted, LimitExceeded, ServerError, TinkerServeError, UserError
from app.metrics import server_metrics
from app.protocol.codec import encode_forward_backward_output
from app.request_log import log_request, outcome_of
from app.scheduling import SeqScheduler
from app.storage.objects import ObjectStorage
from app.store.checkpoints import CheckpointRecord, CheckpointStore
from app.store.futures import JSON_CONTENT_TYPE, PROTO_CONTENT_TYPE, FutureStore
from app.store.metadata import MetadataStore
from app.training.lora import AdapterSpec
from app.training.optim import AdamParams
from app.training.sharding import merge_shards
from app.workers.commands import Command, CommandError, CommandKind, ForwardBackwardArgs
from app.workers.group import WorkerGroup

logger = logging.getLogger("tinker_serve.trainer")


@dataclass(frozen=True)
class ForwardBackwardOp:
    request_id: str
    args: ForwardBackwardArgs


@dataclass(frozen=True)
class OptimStepOp:
    request_id: str
    adam: AdamParams


@dataclass(frozen=True)
class CheckpointOp:
    """As of every earlier seq_id: save sampler weights (SAVE_ADAPTER) or a training checkpoint (SAVE_STATE) at
    storage `location`, or load one (LOAD_STATE); then answer `result`. A save with `record` becomes a visible
    checkpoint once written (replacing one of the same name only with `overwrite`)."""

    request_id: str
    action: CommandKind
    location: str
    result: dict
    with_optimizer: bool = False
    record: CheckpointRecord | None = None
    overwrite: bool = False

    def command(self, model_id: str) -> Command:
        return Command(self.action, model_id, location=self.location, with_optimizer=self.with_optimizer)


@dataclass(frozen=True)
class SkipOp:
    """A seq_id whose request was rejected at the ingress (its future already failed); it only advances order."""

    request_id: str


TrainingOp = Union[ForwardBackwardOp, OptimStepOp, CheckpointOp, SkipOp]
Queued = tuple[int, TrainingOp]  # (seq_id, op)


def _json(payload: dict) -> bytes:
    return json.dumps(payload).encode()


def _op_name(op: TrainingOp) -> str:
    """The name in metrics and logs of an operation that runs (never a SkipOp)."""
    if isinstance(op, ForwardBackwardOp):
        return "forward" if op.args.forward_only else "forward_backward"
    return op.action.value if isinstance(op, CheckpointOp) else "optim_step"


def _first_error(per_rank: list) -> dict | None:
    """The failed-future body of the first rank whose reply is an error, if any."""
    return next((reply.error for reply in per_rank if isinstance(reply, CommandError)), None)


class TrainerService:
    def __init__(self, name: str, limits: LimitsConfig, group: WorkerGroup, futures: FutureStore,
                 metadata: MetadataStore, checkpoints: CheckpointStore, storage: ObjectStorage) -> None:
        self.name = name
        self._metadata = metadata
        self._checkpoints = checkpoints
        self._storage = storage
        self._limits = limits
        self._group = group
        self._futures = futures
        self._scheduler: SeqScheduler[Queued] = SeqScheduler(
            self._dispatch, gap_timeout_s=limits.seq_gap_timeout_seconds)
        self._models: set[str] = set()

    async def start(self) -> None:
        """Start the workers; futures left pending by a previous incarnation of this trainer can never finish: fail them."""
        lost = ServerError(f"trainer {self.name} restarted and its models' in-memory state was lost; "
                           "create the model again (or load a checkpoint) and resend")
        orphans = await self._futures.fail_pending_of(await self._metadata.model_ids_on(self.name), lost.to_body())
        if orphans:
            logger.warning("failed %d futures left pending by a previous incarnation of trainer %s", orphans, self.name)
        await self._group.start()

    def check_health(self) -> None:
        self._group.check_health()

    async def stop(self) -> None:
        """End the workers' loops, so Ray Train ends the run and releases its placement group."""
        await self._group.stop()

    async def worker_pids(self) -> list[int]:
        """The process id of each rank, in rank order."""
        return [rank_replies[0] for rank_replies in await self._group.call([Command(CommandKind.PING)])]

    async def create_model(self, request_id: str, model_id: str, spec: AdapterSpec,
                           load: CheckpointOp | None = None) -> None:
        """Create the model (seq_id 0), and with `load` fill it from a checkpoint in the same step."""
        commands = [Command(CommandKind.CREATE_MODEL, model_id, spec=spec)]
        if load is not None:
            commands.append(load.command(model_id))
        try:
            if model_id not in self._models and len(self._models) >= self._limits.max_models_per_base:
                raise LimitExceeded(f"trainer {self.name} already holds limits.max_models_per_base="
                                    f"{self._limits.max_models_per_base} models; unload one first", field="base_model")
            replies = await self._group.call(commands)
        except TinkerServeError as exc:
            await self._futures.fail(request_id, exc.to_body())
            return
        errors = [_first_error([rank_replies[i] for rank_replies in replies]) for i in range(len(commands))]
        error = next((e for e in errors if e is not None), None)
        if error is not None:
            await self._group.call([Command(CommandKind.REMOVE_MODEL, model_id)])
            await self._futures.fail(request_id, error)
            return
        self._models.add(model_id)
        self._scheduler.open(model_id, next_seq=1)
        result = load.result if load is not None else {"model_id": model_id, "type": "create_model"}
        await self._futures.complete(request_id, _json(result), JSON_CONTENT_TYPE)

    async def unload_model(self, request_id: str, model_id: str) -> None:
        self._scheduler.close(model_id, ServerError(f"model {model_id!r} was unloaded"))
        self._models.discard(model_id)
        await self._group.call([Command(CommandKind.REMOVE_MODEL, model_id)])
        await self._futures.complete(request_id, _json({"model_id": model_id, "type": "unload_model"}), JSON_CONTENT_TYPE)

    async def submit(self, model_id: str, seq_id: int, op: TrainingOp) -> None:
        """Queue `op`; returns once its future is written (success or failure)."""
        try:
            await self._scheduler.submit(model_id, seq_id, (seq_id, op))
        except TinkerServeError as exc:
            await self._futures.fail_if_pending(op.request_id, exc.to_body())

    def _dispatch(self, model_id: str, run: list[Queued]) -> Awaitable[list[None]]:
        """Send the run to the workers now (order matters); the returned awaitable writes its futures."""
        work = [(seq_id, op) for seq_id, op in run if not isinstance(op, SkipOp)]
        pending = self._group.send([self._command(model_id, op) for _, op in work]) if work else None
        server_metrics().queue_depth.set(self._scheduler.waiting(model_id),
                                         tags={"trainer": self.name, "model_id": model_id})
        return self._write_outcomes(model_id, len(run), work, pending)

    async def _write_outcomes(self, model_id: str, run_length: int, work: list[Queued],
                              pending: Awaitable[list[list]] | None) -> list[None]:
        started = time.monotonic()
        try:
            replies = await pending if pending is not None else []
        except GroupRestarted as exc:
            self._lose_all_models(exc)
            raise
        seconds = time.monotonic() - started
        self._record([op for _, op in work], seconds)
        for i, (seq_id, op) in enumerate(work):
            try:
                error = await self._write_outcome(op, [rank_replies[i] for rank_replies in replies])
            except TinkerServeError as exc:
                error = exc.to_body()
                await self._futures.fail(op.request_id, error)
            log_request("ran", op=_op_name(op), model_id=model_id, seq_id=seq_id, tinker_request_id=op.request_id,
                        outcome=outcome_of(error), run_seconds=round(seconds, 4), run_ops=len(work))
        return [None] * run_length

    @staticmethod
    def _command(model_id: str, op: TrainingOp) -> Command:
        if isinstance(op, ForwardBackwardOp):
            return Command(CommandKind.FORWARD_BACKWARD, model_id, fwdbwd=op.args)
        if isinstance(op, CheckpointOp):
            return op.command(model_id)
        return Command(CommandKind.OPTIM_STEP, model_id, adam=op.adam)

    async def _write_outcome(self, op: TrainingOp, per_rank: list) -> dict | None:
        """Complete the op's future, or fail it with the first rank's error (returned)."""
        error = _first_error(per_rank)
        if error is not None:
            await self._futures.fail(op.request_id, error)
            return error
        if isinstance(op, ForwardBackwardOp):
            result = merge_shards(op.args.batch.offsets, per_rank)
            await self._futures.complete(op.request_id, encode_forward_backward_output(result), PROTO_CONTENT_TYPE)
        elif isinstance(op, CheckpointOp):
            if op.record is not None:
                await self._commit(op, size_bytes=per_rank[0])
            await self._futures.complete(op.request_id, _json(op.result), JSON_CONTENT_TYPE)
        else:
            await self._futures.complete(op.request_id, _json({"metrics": per_rank[0]}), JSON_CONTENT_TYPE)
        return None

    def _record(self, work: list[TrainingOp], seconds: float) -> None:
        metrics = server_metrics()
        for op in work:
            metrics.op_seconds.observe(seconds, tags={"trainer": self.name, "op": _op_name(op)})
            if isinstance(op, ForwardBackwardOp) and not op.args.forward_only:
                metrics.tokens.inc(int(op.args.batch.offsets[-1]), tags={"name": self.name, "kind": "trained"})

    async def _commit(self, op: CheckpointOp, size_bytes: int) -> None:
        """Make a written checkpoint visible; the files it replaced, or its own if refused, are removed."""
        try:
            replaced = await self._checkpoints.commit(
                replace(op.record, size_bytes=size_bytes, created_at=time.time()), op.overwrite)
        except UserError:
            await asyncio.to_thread(self._storage.delete, op.location)
            raise
        if replaced is not None:
            await asyncio.to_thread(self._storage.delete, replaced)

    def _lose_all_models(self, reason: Exception) -> None:
        logger.error("worker group restarted; %d models lost: %s", len(self._models), reason)
        for model_id in list(self._models):
            self._scheduler.close(model_id, reason)
        self._models.clear()
