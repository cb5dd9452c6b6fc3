"""Durable models: when to snapshot a live model, and how to rebuild one on fresh workers from its snapshot and
journal (app.db.journal) so it equals the model that was lost."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import cast

from app.db.journal import KEPT_SNAPSHOTS, JournalEntry, JournalStore, Snapshot
from app.errors import GroupRestarted, ServerError, TinkerServeError
from app.messages import (
    ForwardBackwardCommand,
    LoadStateCommand,
    RemoveModelCommand,
    Replies,
    SequencedOp,
    Skip,
    SnapshotCommand,
    WorkerCommand,
)
from app.metrics import server_metrics
from app.operations import changes_model, operation
from app.operations.create_model import CreateModel
from app.storage.objects import ObjectStorage
from app.storage.paths import snapshot_location
from app.trainer.rank_replies import first_failed_command
from app.trainer.worker_group import WorkerGroup

logger = logging.getLogger("tinker_serve.trainer")


@dataclass(frozen=True)
class PlannedSnapshot:
    index: int  # of the SnapshotCommand in the run's commands
    seq_id: int  # the operation it follows
    location: str


class SnapshotPolicy:
    """Snapshots a model after an optim_step (or a load) once `every_steps` of them ran since its last snapshot,
    or `every_seconds` passed."""

    def __init__(self, every_steps: int, every_seconds: float) -> None:
        self._every_steps = every_steps
        self._every_seconds = every_seconds
        self._since: dict[str, tuple[int, float]] = {}  # model_id -> (steps since its snapshot, when that was)

    def forget(self, model_id: str) -> None:
        self._since.pop(model_id, None)

    def plan(self, model_id: str, seq_ids: Sequence[int], ops: Sequence[SequencedOp]) -> PlannedSnapshot | None:
        """Where a run's snapshot goes, if it takes one: right after its last step (gradients are empty there)."""
        steps = [i for i, op in enumerate(ops) if operation(op).counts_toward_snapshot(op)]
        if not steps:
            return None
        now = time.monotonic()
        count, since = self._since.get(model_id, (0, now))
        count += len(steps)
        if count < self._every_steps and now - since < self._every_seconds:
            self._since[model_id] = (count, since)
            return None
        self._since[model_id] = (0, now)
        last = steps[-1]
        return PlannedSnapshot(last + 1, seq_ids[last], snapshot_location(model_id, seq_ids[last]))


def creation_commands(model_id: str, create: CreateModel) -> list[WorkerCommand]:
    """What the workers run to create the model: its adapter, then the checkpoint it is filled from, if any."""
    return [operation(op).command(model_id, op) for op in (create, create.load) if op is not None]


def run_commands(model_id: str, ops: Sequence[SequencedOp], snapshot: PlannedSnapshot | None) -> list[WorkerCommand]:
    """What the workers run for a run of the model's operations (Skips left out): each one's command, serving its
    request, and the snapshot planned after its last step, if any."""
    commands: list[WorkerCommand] = [
        replace(operation(op).command(model_id, op), request_id=op.request_id) for op in ops
    ]
    if snapshot is not None:
        commands.insert(snapshot.index, SnapshotCommand(model_id, snapshot.location))
    return commands


async def record_snapshot(
    journal: JournalStore,
    storage: ObjectStorage,
    trainer: str,
    model_id: str,
    snapshot: PlannedSnapshot,
    run_seconds: float,
) -> None:
    """Record a snapshot the workers took (its run took `run_seconds`) and delete the ones it supersedes."""
    dropped = await journal.record_snapshot(model_id, snapshot.seq_id, snapshot.location)
    metrics = server_metrics()
    metrics.snapshots.inc(tags={"trainer": trainer})
    metrics.snapshot_capture_seconds.observe(run_seconds, tags={"trainer": trainer})
    for location in dropped:
        await asyncio.to_thread(storage.delete, location)


@dataclass(frozen=True)
class Takeover:
    """How a new trainer takes over a live model: the seq_id its queue opens at, and the journaled operations from
    there to queue again in order (those that finished, e.g. rejected at the ingress, as Skips that only advance the
    order). `given_up`: unfinished ones that were running at as many deaths of the workers as allowed, to fail instead
    of rerunning (queued as Skips: app.trainer.worker_deaths)."""

    next_seq: int
    queued: list[tuple[int, SequencedOp]]
    given_up: list[JournalEntry] = field(default_factory=list)


async def unfinished(journal: JournalStore, model_id: str, max_worker_deaths: int) -> Takeover | CreateModel | None:
    """What a new trainer does with a live model: take it over (its creation finished), or run its creation (journaled
    but never finished: created while no trainer ran, or while this one started), or nothing yet (None: no journal,
    so its creation is being journaled right now and its create call follows). An unfinished operation charged with
    `max_worker_deaths` deaths of the workers is given up."""
    entries = await journal.entries(model_id)
    if not entries or entries[0].seq_id != 0:
        return None
    if entries[0].state != "completed":
        return _creation(entries[0])
    pending = [e.seq_id for e in entries if e.state == "pending"]
    snapshots = await journal.snapshots_of(model_id)
    start = min(pending) if pending else max([e.seq_id for e in entries] + [s.seq_id for s in snapshots[:1]]) + 1
    given_up = [e for e in entries if e.state == "pending" and e.worker_deaths >= max_worker_deaths]
    rerun = {e.seq_id for e in entries if e.state == "pending"} - {e.seq_id for e in given_up}
    queued: list[tuple[int, SequencedOp]] = [
        (e.seq_id, e.op if e.seq_id in rerun else Skip(e.request_id))
        for e in entries
        if e.seq_id >= start  # after the creation (seq_id 0): start is past it
    ]
    return Takeover(start, queued, given_up)


def resend(group: WorkerGroup, unanswered: dict[int, list[WorkerCommand]]) -> dict[int, Awaitable[Replies]]:
    """Send every unanswered message again, in dispatch order (runs of lost models fail on the workers); a group that
    is down gives each message's waiter the error. A message of several models' runs (a mixed pass) goes as one
    message per model, in its order, so a death is charged to the model whose run was running alone: one that kills
    the workers fails by itself, not the operations it happened to share a pass with."""
    resent: dict[int, Awaitable[Replies]] = {}
    for number in sorted(unanswered):
        commands = unanswered[number]
        parts = _by_model(commands)
        try:
            sends = [group.send([commands[i] for i in part]) for part in parts]
        except Exception as exc:  # noqa: BLE001 - handed to the message's waiter
            failed: asyncio.Future[Replies] = asyncio.get_running_loop().create_future()
            failed.set_exception(exc)
            resent[number] = failed
            continue
        resent[number] = sends[0] if len(sends) == 1 else _joined(sends, parts, len(commands))
    return resent


def _by_model(commands: Sequence[WorkerCommand]) -> list[list[int]]:
    """The positions of each model's commands, models in the order they first appear (a command of no model, a
    no-op, goes with those of no model)."""
    parts: dict[str, list[int]] = {}
    for i, command in enumerate(commands):
        parts.setdefault(getattr(command, "model_id", ""), []).append(i)
    return list(parts.values())


async def _joined(sends: list[Awaitable[Replies]], parts: list[list[int]], length: int) -> Replies:
    """The replies of a message sent in parts, in the message's order."""
    answers = await asyncio.gather(*sends)  # every part awaited (a failed one's error is the message's)
    joined: Replies = [[None] * length for _ in answers[0]]
    for replies, part in zip(answers, parts, strict=True):
        for rank, rank_replies in enumerate(replies):
            for i, reply in zip(part, rank_replies, strict=True):
                joined[rank][i] = reply
    return joined


async def rebuild(group: WorkerGroup, journal: JournalStore, model_id: str) -> int:
    """Make the model on the workers as it was after its last completed operation: its newest snapshot that loads
    (the newest may be unfinished), then every completed operation after it that changed the model, in seq_id
    order. Returns how many were replayed; ServerError when it cannot be rebuilt."""
    entries = await journal.entries(model_id)
    if not entries or entries[0].seq_id != 0 or entries[0].state != "completed":
        raise ServerError(f"model {model_id!r} has no journal to rebuild it from")
    creation = _creation(entries[0])
    snapshots = await journal.snapshots_of(model_id)
    # without a snapshot the journal starts at the creation, as long as no snapshot ever pruned it
    candidates: list[Snapshot | None] = [*snapshots, *([None] if len(snapshots) < KEPT_SNAPSHOTS else [])]
    for snapshot in candidates:
        commands, replayed = _rebuild_commands(model_id, creation, entries, snapshot)
        error = first_failed_command(await group.call([RemoveModelCommand(model_id), *commands]))
        if error is None:
            return replayed
        logger.warning(
            "rebuilding %s from %s failed at command %d: %s",
            model_id,
            snapshot.location if snapshot else "its creation",
            error[0],
            error[1],
        )
    raise ServerError(f"model {model_id!r} could not be rebuilt from its snapshots and journal")


async def rebuild_all(
    group: WorkerGroup, journal: JournalStore, model_ids: Collection[str], lose: Callable[[str, Exception], None]
) -> int:
    """Rebuild every model, in model_id order, and `lose` those that cannot be, with the reason; returns how many
    operations were replayed. A restart of the group meanwhile (GroupRestarted) ends it."""
    replayed = 0
    for model_id in sorted(model_ids):
        try:
            replayed += await rebuild(group, journal, model_id)
        except GroupRestarted:
            raise
        except TinkerServeError as exc:
            lose(model_id, exc)
    return replayed


def _rebuild_commands(
    model_id: str, creation: CreateModel, entries: list[JournalEntry], snapshot: Snapshot | None
) -> tuple[list[WorkerCommand], int]:
    if snapshot is None:
        commands = creation_commands(model_id, creation)
    else:  # the snapshot holds what the creation loaded, if anything
        commands = [
            operation(creation).command(model_id, creation),
            LoadStateCommand(model_id, snapshot.location, with_optimizer=True),
        ]
    after = snapshot.seq_id if snapshot is not None else 0  # the creation (seq_id 0) is never replayed
    replay = [e for e in entries if e.seq_id > after and e.state == "completed" and changes_model(e.op)]
    commands += [_replay_command(model_id, e) for e in replay]
    return commands, len(replay)


def _creation(entry: JournalEntry) -> CreateModel:
    """The operation of a model's journal entry at seq_id 0: its creation (app.api.models journals it there)."""
    return cast(CreateModel, entry.op)


def _replay_command(model_id: str, entry: JournalEntry) -> WorkerCommand:
    """What reruns a completed operation exactly: its command, as it ran in its mixed pass if it ran in one."""
    command = operation(entry.op).command(model_id, entry.op)
    if entry.layout is not None and isinstance(command, ForwardBackwardCommand):
        return replace(command, replay=entry.layout)
    return command
