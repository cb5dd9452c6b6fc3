"""How the Trainer runs each operation of app.messages: the worker command it sends, its name in logs and
metrics, and the reply it writes once every rank has answered. The ingress never builds replies.

Adding a sequenced operation: its message (app.messages), an `Operation` here registered in OPERATIONS,
and its router (app.api). An operation that needs a new worker capability also adds a command to
app.messages.WorkerCommand and its case in app.workers.execute.
"""

from __future__ import annotations

import asyncio
import json
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

from app.db.checkpoints import CheckpointRecord, CheckpointStore
from app.db.futures import JSON_CONTENT_TYPE, PROTO_CONTENT_TYPE
from app.errors import UserError
from app.messages import (
    CommandError,
    CreateModel,
    ForwardBackward,
    ForwardBackwardCommand,
    LoadCheckpoint,
    LoadStateCommand,
    OperationCommand,
    OptimStep,
    OptimStepCommand,
    RankReply,
    Replies,
    SaveCheckpoint,
    SaveCommand,
    SavedParts,
    SaveForSampler,
    SequencedOp,
    ShardOutput,
)
from app.protocol.results import encode_forward_backward_output
from app.storage.objects import ObjectStorage
from app.training.sharding import merge_shards

Op = TypeVar("Op")
R = TypeVar("R")  # what each rank answers the operation's command with, when it succeeds


@dataclass(frozen=True)
class Reply:
    """A future's result as stored: its bytes and their content type."""

    payload: bytes
    content_type: str
    metrics: dict[str, float] | None = None  # a training step's, for the run's history
    # a custom loss's estimated compute, in tokens of the base's training: what it costs in the fair share beyond the
    # tokens charged when it was sent
    cost_tokens: int = 0

    @classmethod
    def json(cls, body: dict[str, Any]) -> Reply:
        return cls(json.dumps(body).encode(), JSON_CONTENT_TYPE)


class CheckpointCommitter:
    """Makes written checkpoints visible; the files a commit replaced, or its own if refused, are removed."""

    def __init__(self, checkpoints: CheckpointStore, storage: ObjectStorage) -> None:
        self._checkpoints = checkpoints
        self._storage = storage

    async def commit(self, record: CheckpointRecord, size_bytes: int, overwrite: bool) -> None:
        try:
            replaced = await self._checkpoints.commit(
                replace(record, size_bytes=size_bytes, created_at=time.time()), overwrite
            )
        except UserError:
            await asyncio.to_thread(self._storage.delete, record.location)
            raise
        if replaced is not None:
            await asyncio.to_thread(self._storage.delete, replaced)


class Operation(ABC, Generic[Op, R]):
    """One kind of operation as the Trainer runs it: `Op` its message, `R` each rank's reply to its command."""

    @abstractmethod
    def name(self, op: Op) -> str:
        """The operation's name in logs and metrics (the API call's name)."""

    @abstractmethod
    def command(self, model_id: str, op: Op) -> OperationCommand:
        """What every rank runs."""

    @abstractmethod
    async def reply(self, model_id: str, op: Op, per_rank: list[R], committer: CheckpointCommitter) -> Reply:
        """The future's result, from each rank's successful answer."""


class _ForwardBackward(Operation[ForwardBackward, ShardOutput]):
    def name(self, op: ForwardBackward) -> str:
        return "forward" if op.args.forward_only else "forward_backward"

    def command(self, model_id: str, op: ForwardBackward) -> ForwardBackwardCommand:
        return ForwardBackwardCommand(model_id, op.args)

    async def reply(
        self, model_id: str, op: ForwardBackward, per_rank: list[ShardOutput], committer: CheckpointCommitter
    ) -> Reply:
        result = merge_shards(op.args.batch.offsets, per_rank)
        cost = max(shard.loss_cost_tokens for shard in per_rank)
        return Reply(encode_forward_backward_output(result), PROTO_CONTENT_TYPE, result.metrics, cost)


class _OptimStep(Operation[OptimStep, dict[str, float]]):
    def name(self, op: OptimStep) -> str:
        return "optim_step"

    def command(self, model_id: str, op: OptimStep) -> OptimStepCommand:
        return OptimStepCommand(model_id, op.params)

    async def reply(
        self, model_id: str, op: OptimStep, per_rank: list[dict[str, float]], committer: CheckpointCommitter
    ) -> Reply:
        return replace(Reply.json({"metrics": per_rank[0]}), metrics=per_rank[0])


# A checkpoint's kind -> the call that saves it, and what its ranks write.
_SAVES: dict[str, tuple[str, SavedParts]] = {
    "weights": ("save_weights", "state"),
    "sampler_weights": ("save_weights_for_sampler", "adapter"),
    "external_weights": ("save_weights_external", "export"),
}


class _SaveCheckpoint(Operation[SaveCheckpoint, int]):
    def name(self, op: SaveCheckpoint) -> str:
        return _SAVES[op.record.path.kind][0]

    def command(self, model_id: str, op: SaveCheckpoint) -> SaveCommand:
        return SaveCommand(model_id, op.record.location, _SAVES[op.record.path.kind][1])

    async def reply(
        self, model_id: str, op: SaveCheckpoint, per_rank: list[int], committer: CheckpointCommitter
    ) -> Reply:
        await committer.commit(op.record, size_bytes=per_rank[0], overwrite=op.overwrite)
        return Reply.json({"path": op.record.path.uri, "type": self.name(op)})


class _SaveForSampler(Operation[SaveForSampler, int]):
    def name(self, op: SaveForSampler) -> str:
        return "save_weights_for_sampler"

    def command(self, model_id: str, op: SaveForSampler) -> SaveCommand:
        return SaveCommand(model_id, op.location, "adapter")

    async def reply(
        self, model_id: str, op: SaveForSampler, per_rank: list[int], committer: CheckpointCommitter
    ) -> Reply:
        return Reply.json({"sampling_session_id": op.sampling_session_id, "type": self.name(op)})


class _LoadCheckpoint(Operation[LoadCheckpoint, None]):
    def name(self, op: LoadCheckpoint) -> str:
        return "load_weights"

    def command(self, model_id: str, op: LoadCheckpoint) -> LoadStateCommand:
        return LoadStateCommand(model_id, op.location, op.with_optimizer)

    async def reply(
        self, model_id: str, op: LoadCheckpoint, per_rank: list[None], committer: CheckpointCommitter
    ) -> Reply:
        return Reply.json({"path": op.path, "model_id": model_id, "type": self.name(op)})


OPERATIONS: dict[type, Operation[Any, Any]] = {
    ForwardBackward: _ForwardBackward(),
    OptimStep: _OptimStep(),
    SaveCheckpoint: _SaveCheckpoint(),
    SaveForSampler: _SaveForSampler(),
    LoadCheckpoint: _LoadCheckpoint(),
}


def operation(op: SequencedOp) -> Operation[Any, Any]:
    """The Operation that runs `op` (never a Skip: those only advance order). Its reply takes the ranks' replies to
    its command once none is a CommandError (first_error), which are then of its type R."""
    return OPERATIONS[type(op)]


def changes_model(op: CreateModel | SequencedOp) -> bool:
    """Whether running `op` changes the model's weights, optimizer state or gradients (what a rebuild replays)."""
    if isinstance(op, ForwardBackward):
        return not op.args.forward_only
    return isinstance(op, OptimStep | LoadCheckpoint)


def first_error(per_rank: list[RankReply]) -> dict[str, Any] | None:
    """The failed-future body of the first rank whose reply to a command is an error, if any."""
    return next((reply.error for reply in per_rank if isinstance(reply, CommandError)), None)


def first_failed_command(replies: Replies) -> tuple[int, dict[str, Any]] | None:
    """(index, error body) of the first of a message's commands some rank failed; `replies[rank][command]`."""
    for i in range(len(replies[0]) if replies else 0):
        error = first_error([rank_replies[i] for rank_replies in replies])
        if error is not None:
            return i, error
    return None
