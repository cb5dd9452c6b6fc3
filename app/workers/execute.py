"""How one rank executes a command (app.messages.Command) against its TrainingEngine."""

from __future__ import annotations

import logging
import os
import tempfile
import traceback
from pathlib import Path
from typing import Any, TypeVar

import ray
import torch

from app.errors import NotFound, ServerError, TinkerServeError
from app.messages import Command, CommandError, CommandKind
from app.storage.objects import ObjectStorage
from app.training.batch import PackedBatch
from app.training.engine import TrainingEngine
from app.workers.snapshots import SnapshotWriter

logger = logging.getLogger("tinker_serve.worker")

_T = TypeVar("_T")


def _payload(cmd: Command, value: _T | None) -> _T:
    """The part of `cmd` its kind needs (Command carries one optional field per kind)."""
    if value is None:
        raise ServerError(f"{cmd.kind.value} command sent without its arguments")
    return value


def _save(engine: TrainingEngine, storage: ObjectStorage, cmd: Command) -> int:
    """Store the model's adapter (or whole training state) at the command's location; returns its size.
    Rank 0 writes (ranks hold identical weights and optimizer state); the others only check the model."""
    save = {
        CommandKind.SAVE_ADAPTER: engine.save_adapter,
        CommandKind.SAVE_STATE: engine.save_state,
        CommandKind.SAVE_EXPORT: engine.save_export,
    }[cmd.kind]
    if engine.rank != 0:
        engine.require_model(cmd.model_id)
        return 0
    return storage.write(cmd.location, lambda out: save(cmd.model_id, out))


def _load(engine: TrainingEngine, storage: ObjectStorage, cmd: Command) -> None:
    with tempfile.TemporaryDirectory(prefix="tinker-serve-load-") as cache:  # object stores download here
        try:
            directory = storage.fetch(cmd.location, Path(cache))
        except FileNotFoundError:
            raise NotFound("the checkpoint's files are gone from storage (deleted or expired)", field="path") from None
        engine.load_state(cmd.model_id, directory, cmd.with_optimizer)


def _snapshot(engine: TrainingEngine, snapshots: SnapshotWriter, cmd: Command) -> None:
    """Rank 0 copies the model's state and writes it on a thread; the others only check the model."""
    if engine.rank != 0:
        engine.require_model(cmd.model_id)
        return
    snapshots.write(cmd.location, engine.capture_state(cmd.model_id))


def execute(engine: TrainingEngine, storage: ObjectStorage, snapshots: SnapshotWriter, cmd: Command) -> Any:
    """Run one command on this rank; errors come back as CommandError instead of killing the loop."""
    try:
        if cmd.kind is CommandKind.FORWARD_BACKWARD:
            args = _payload(cmd, cmd.fwdbwd)
            batch = args.batch if isinstance(args.batch, PackedBatch) else ray.get(args.batch)
            return engine.forward_backward(
                cmd.model_id, args.loss_fn, args.loss_config, batch, args.forward_only, args.custom_loss
            )
        if cmd.kind is CommandKind.OPTIM_STEP:
            if cmd.optim is None:  # not _payload: mypy cannot solve its _T for a union
                raise ServerError("optim_step command sent without its arguments")
            return engine.optim_step(cmd.model_id, cmd.optim)
        if cmd.kind in (CommandKind.SAVE_ADAPTER, CommandKind.SAVE_STATE, CommandKind.SAVE_EXPORT):
            return _save(engine, storage, cmd)
        if cmd.kind is CommandKind.LOAD_STATE:
            return _load(engine, storage, cmd)
        if cmd.kind is CommandKind.SNAPSHOT:
            return _snapshot(engine, snapshots, cmd)
        if cmd.kind is CommandKind.CREATE_MODEL:
            return engine.create_model(cmd.model_id, _payload(cmd, cmd.spec))
        if cmd.kind is CommandKind.REMOVE_MODEL:
            return engine.remove_model(cmd.model_id)
        return os.getpid()  # PING: which process serves this rank (diagnostics, failure tests)
    except TinkerServeError as exc:
        return CommandError(exc.to_body())
    except Exception as exc:  # logged, reported, and the loop keeps serving
        logger.exception("rank %d: %s of model %r failed", engine.rank, cmd.kind.value, cmd.model_id)
        if cmd.kind is CommandKind.FORWARD_BACKWARD and (engine.sharded or isinstance(exc, torch.OutOfMemoryError)):
            # Mid-pass: with a sharded base the other ranks wait in a weight gather this rank will not join, and an
            # out-of-memory error leaves this model's gradients partial. This rank ends instead: the group restarts,
            # every model is rebuilt exactly from its snapshot and journal, and the death is charged to this
            # operation, which is given up, with a user error, once charged twice (app.trainer.worker_deaths).
            logger.error("rank %d: ending this worker so the group restarts in step", engine.rank)
            os._exit(70)
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        return CommandError(ServerError(f"{cmd.kind.value} failed on a worker: {detail}").to_body())
