"""How the Trainer runs each operation of app.messages: the worker command it sends, its name in logs and
metrics, and the reply it writes once every rank has answered. The ingress never builds replies.

Adding a sequenced operation: its message (app.messages), an `Operation` here registered in OPERATIONS,
and its router (app.api). An operation that needs a new worker capability also adds a CommandKind and its
case in app.workers.execute.
"""

from __future__ import annotations

import asyncio
import json
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar, cast

from app.db.checkpoints import CheckpointRecord, CheckpointStore
from app.db.futures import JSON_CONTENT_TYPE, PROTO_CONTENT_TYPE
from app.errors import UserError
from app.messages import (
    Command,
    CommandError,
    CommandKind,
    CreateModel,
    ForwardBackward,
    LoadCheckpoint,
    OptimStep,
    SaveCheckpoint,
    SaveForSampler,
    SequencedOp,
)
from app.protocol.results import encode_forward_backward_output
from app.storage.objects import ObjectStorage
from app.training.batch import PackedBatch
from app.training.sharding import merge_shards

Op = TypeVar("Op")


@dataclass(frozen=True)
class Reply:
    """A future's result as stored: its bytes and their content type."""

    payload: bytes
    content_type: str
    metrics: dict[str, float] | None = None  # a training step's, for the run's history

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


class Operation(ABC, Generic[Op]):
    """One kind of operation as the Trainer runs it."""

    @abstractmethod
    def name(self, op: Op) -> str:
        """The operation's name in logs and metrics (the API call's name)."""

    @abstractmethod
    def command(self, model_id: str, op: Op) -> Command:
        """What every rank runs."""

    @abstractmethod
    async def reply(self, model_id: str, op: Op, per_rank: list[Any], committer: CheckpointCommitter) -> Reply:
        """The future's result, from each rank's successful answer."""


class _ForwardBackward(Operation[ForwardBackward]):
    def name(self, op: ForwardBackward) -> str:
        return "forward" if op.args.forward_only else "forward_backward"

    def command(self, model_id: str, op: ForwardBackward) -> Command:
        return Command(CommandKind.FORWARD_BACKWARD, model_id, fwdbwd=op.args)

    async def reply(
        self, model_id: str, op: ForwardBackward, per_rank: list[Any], committer: CheckpointCommitter
    ) -> Reply:
        batch = cast(PackedBatch, op.args.batch)  # an op keeps its batch; only the shipped command holds a ref
        result = merge_shards(batch.offsets, per_rank)
        return Reply(encode_forward_backward_output(result), PROTO_CONTENT_TYPE, result.metrics)


class _OptimStep(Operation[OptimStep]):
    def name(self, op: OptimStep) -> str:
        return "optim_step"

    def command(self, model_id: str, op: OptimStep) -> Command:
        return Command(CommandKind.OPTIM_STEP, model_id, optim=op.params)

    async def reply(self, model_id: str, op: OptimStep, per_rank: list[Any], committer: CheckpointCommitter) -> Reply:
        return replace(Reply.json({"metrics": per_rank[0]}), metrics=per_rank[0])


# A checkpoint's kind -> the call that saves it, and what its ranks write.
_SAVES = {
    "weights": ("save_weights", CommandKind.SAVE_STATE),
    "sampler_weights": ("save_weights_for_sampler", CommandKind.SAVE_ADAPTER),
    "external_weights": ("save_weights_external", CommandKind.SAVE_EXPORT),
}


class _SaveCheckpoint(Operation[SaveCheckpoint]):
    def name(self, op: SaveCheckpoint) -> str:
        return _SAVES[op.record.path.kind][0]

    def command(self, model_id: str, op: SaveCheckpoint) -> Command:
        return Command(_SAVES[op.record.path.kind][1], model_id, location=op.record.location)

    async def reply(
        self, model_id: str, op: SaveCheckpoint, per_rank: list[Any], committer: CheckpointCommitter
    ) -> Reply:
        await committer.commit(op.record, size_bytes=per_rank[0], overwrite=op.overwrite)
        return Reply.json({"path": op.record.path.uri, "type": self.name(op)})


class _SaveForSampler(Operation[SaveForSampler]):
    def name(self, op: SaveForSampler) -> str:
        return "save_weights_for_sampler"

    def command(self, model_id: str, op: SaveForSampler) -> Command:
        return Command(CommandKind.SAVE_ADAPTER, model_id, location=op.location)

    async def reply(
        self, model_id: str, op: SaveForSampler, per_rank: list[Any], committer: CheckpointCommitter
    ) -> Reply:
        return Reply.json({"sampling_session_id": op.sampling_session_id, "type": self.name(op)})


class _LoadCheckpoint(Operation[LoadCheckpoint]):
    def name(self, op: LoadCheckpoint) -> str:
        return "load_weights"

    def command(self, model_id: str, op: LoadCheckpoint) -> Command:
        return Command(CommandKind.LOAD_STATE, model_id, location=op.location, with_optimizer=op.with_optimizer)

    async def reply(
        self, model_id: str, op: LoadCheckpoint, per_rank: list[Any], committer: CheckpointCommitter
    ) -> Reply:
        return Reply.json({"path": op.path, "model_id": model_id, "type": self.name(op)})


OPERATIONS: dict[type, Operation[Any]] = {
    ForwardBackward: _ForwardBackward(),
    OptimStep: _OptimStep(),
    SaveCheckpoint: _SaveCheckpoint(),
    SaveForSampler: _SaveForSampler(),
    LoadCheckpoint: _LoadCheckpoint(),
}


def operation(op: SequencedOp) -> Operation[Any]:
    """The Operation that runs `op` (never a Skip: those only advance order)."""
    return OPERATIONS[type(op)]


def changes_model(op: CreateModel | SequencedOp) -> bool:
    """Whether running `op` changes the model's weights, optimizer state or gradients (what a rebuild replays)."""
    if isinstance(op, ForwardBackward):
        return not op.args.forward_only
    return isinstance(op, OptimStep | LoadCheckpoint)


def first_error(per_rank: list[Any]) -> dict[str, Any] | None:
    """The failed-future body of the first rank whose reply to a command is an error, if any."""
    return next((reply.error for reply in per_rank if isinstance(reply, CommandError)), None)


def first_failed_command(replies: list[list[Any]]) -> tuple[int, dict[str, Any]] | None:
    """(index, error body) of the first of a message's commands some rank failed; `replies[rank][command]`."""
    for i in range(len(replies[0]) if replies else 0):
        error = first_error([rank_replies[i] for rank_replies in replies])
        if error is not None:
            return i, error
    return None
