"""How one rank executes a message's worker commands (app.messages.WorkerCommand) against its TrainingEngine."""

from __future__ import annotations

import logging
import os
import tempfile
import traceback
from pathlib import Path
from typing import TypeGuard, assert_never

import torch

from app.errors import NotFound, ServerError, TinkerServeError
from app.link.shipping import Shipped, StoredForwardBackward
from app.messages import (
    CommandError,
    CreateModelCommand,
    ForwardBackwardCommand,
    LoadStateCommand,
    OptimStepCommand,
    PassCommand,
    PingCommand,
    RankReply,
    RemoveModelCommand,
    SaveCommand,
    SnapshotCommand,
    WorkerCommand,
    runs_a_pass,
)
from app.ranks.snapshots import SnapshotWriter
from app.storage.objects import ObjectStorage
from app.training.engine import TrainingEngine

logger = logging.getLogger("tinker_serve.worker")


def _save(engine: TrainingEngine, storage: ObjectStorage, cmd: SaveCommand) -> int:
    """Store the model's adapter (or whole training state) at the command's location; returns its size.
    Rank 0 writes (ranks hold identical weights and optimizer state); the others only check the model."""
    save = {"adapter": engine.save_adapter, "state": engine.save_state, "export": engine.save_export}[cmd.what]
    if engine.rank != 0:
        engine.require_model(cmd.model_id)
        return 0
    return storage.write(cmd.location, lambda out: save(cmd.model_id, out))


def _load(engine: TrainingEngine, storage: ObjectStorage, cmd: LoadStateCommand) -> None:
    with tempfile.TemporaryDirectory(prefix="tinker-serve-load-") as cache:  # object stores download here
        try:
            directory = storage.fetch(cmd.location, Path(cache))
        except FileNotFoundError:
            raise NotFound("the checkpoint's files are gone from storage (deleted or expired)", field="path") from None
        engine.load_state(cmd.model_id, directory, cmd.with_optimizer)


def _snapshot(engine: TrainingEngine, snapshots: SnapshotWriter, cmd: SnapshotCommand) -> None:
    """Rank 0 copies the model's state and writes it on a thread; the others only check the model."""
    if engine.rank != 0:
        engine.require_model(cmd.model_id)
        return
    snapshots.write(cmd.location, engine.capture_state(cmd.model_id))


def _run(engine: TrainingEngine, storage: ObjectStorage, snapshots: SnapshotWriter, cmd: WorkerCommand) -> RankReply:
    match cmd:
        case ForwardBackwardCommand(model_id=model_id, args=args, replay=replay) if replay is not None:
            return engine.replay(model_id, args, replay)
        case ForwardBackwardCommand(model_id=model_id, args=args):
            return engine.forward_backward(
                model_id, args.loss_fn, args.loss_config, args.batch, args.forward_only, args.custom_loss
            )
        case OptimStepCommand(model_id=model_id, params=params):
            return engine.optim_step(model_id, params)
        case SaveCommand():
            return _save(engine, storage, cmd)
        case LoadStateCommand():
            _load(engine, storage, cmd)
        case SnapshotCommand():
            _snapshot(engine, snapshots, cmd)
        case CreateModelCommand(model_id=model_id, spec=spec):
            engine.create_model(model_id, spec)
        case RemoveModelCommand(model_id=model_id):
            engine.remove_model(model_id)
        case PingCommand():
            return os.getpid()  # which process serves this rank (diagnostics, failure tests)
        case _:  # mypy: every command has its case; at run time, an unknown object fails (below)
            assert_never(cmd)
    return None


def execute_message(
    engine: TrainingEngine, storage: ObjectStorage, snapshots: SnapshotWriter, commands: list[Shipped]
) -> list[RankReply]:
    """Run a message's commands in order, one reply each. Consecutive forward(_backward)s of distinct models (what
    the Trainer sends when it mixes models' operations) go to the engine together, which runs them as one pass when
    they mix."""
    replies: list[RankReply] = []
    i = 0
    while i < len(commands):
        together = _forwards_from(commands, i)
        if len(together) < 2:
            replies.append(execute(engine, storage, snapshots, commands[i]))
            i += 1
            continue
        replies += _execute_together(engine, together)
        i += len(together)
    return replies


Forward = PassCommand | StoredForwardBackward


def _runs_a_pass(cmd: Shipped) -> TypeGuard[Forward]:
    """Whether `cmd` runs a forward pass: its command class's declared `forward_pass` (app.messages; something sent
    that is no command runs none)."""
    return getattr(cmd, "forward_pass", False)


def _forwards_from(commands: list[Shipped], start: int) -> list[Forward]:
    """The consecutive forward passes of distinct models at `start`."""
    together: list[Forward] = []
    for cmd in commands[start:]:
        if not _runs_a_pass(cmd) or any(cmd.model_id == other.model_id for other in together):
            break
        together.append(cmd)
    return together


def _opened(cmd: Forward) -> PassCommand:
    """A pass's command, read from the object store if it was stored there."""
    if not isinstance(cmd, StoredForwardBackward):
        return cmd
    command = cmd.command()
    if not runs_a_pass(command):
        raise TypeError(f"a stored {command.name} runs no forward pass")
    return command


def _execute_together(engine: TrainingEngine, shipped: list[Forward]) -> list[RankReply]:
    try:
        requests = [(cmd.model_id, cmd.args) for cmd in map(_opened, shipped)]
        answers = engine.forward_backward_many(requests)
    except Exception as exc:  # noqa: BLE001 - a reply says why; the loop keeps serving
        body = _failure(engine, "forward_backward", ", ".join(cmd.model_id for cmd in shipped), exc, forward=True)
        return [body] * len(shipped)
    return [CommandError(a.to_body()) if isinstance(a, TinkerServeError) else a for a in answers]


def execute(engine: TrainingEngine, storage: ObjectStorage, snapshots: SnapshotWriter, cmd: Shipped) -> RankReply:
    """Run one command on this rank; errors come back as CommandError instead of killing the loop."""
    try:
        return _run(engine, storage, snapshots, cmd.command() if isinstance(cmd, StoredForwardBackward) else cmd)
    except Exception as exc:  # noqa: BLE001 - a reply says why; the loop keeps serving
        name = getattr(cmd, "name", type(cmd).__name__)  # (not a command at all: what was sent instead)
        return _failure(engine, name, getattr(cmd, "model_id", ""), exc, _runs_a_pass(cmd))


def _failure(engine: TrainingEngine, name: str, model_ids: str, exc: Exception, forward: bool) -> CommandError:
    """The reply of a command that raised `exc`; a user's error as it is, anything else logged as a server error."""
    if isinstance(exc, TinkerServeError):
        return CommandError(exc.to_body())
    logger.exception("rank %d: %s of model %r failed", engine.rank, name, model_ids)
    if forward and (engine.sharded or isinstance(exc, torch.OutOfMemoryError)):
        # Mid-pass: with a sharded base the other ranks wait in a weight gather this rank will not join, and an
        # out-of-memory error leaves this model's gradients partial. This rank ends instead: the group restarts,
        # every model is rebuilt exactly from its snapshot and journal, and the death is charged to this
        # operation, which is given up, with a user error, once charged twice (app.trainer.worker_deaths).
        logger.error("rank %d: ending this worker so the group restarts in step", engine.rank)
        os._exit(70)
    detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return CommandError(ServerError(f"{name} failed on a worker: {detail}").to_body())
