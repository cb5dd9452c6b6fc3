"""How a worker command travels to the ranks: inside the mailbox message, or, for a forward pass whose batch is
large, through Ray's object store. Only the worker group's send ships (app.trainer.worker_group) and only a rank's
executor unwraps (app.ranks.execute): the Trainer sends and keeps plain commands (app.messages), whose batches are
PackedBatches."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import ray

from app.messages import WorkerCommand, runs_a_pass

# Below Ray's inlining limit for call arguments and return values (max_direct_call_object_size, 100 KiB): larger ones
# would go through the object store anyway, once more for every rank that takes the message.
INLINE_BATCH_BYTES = 64 * 1024


@dataclass(frozen=True)
class StoredForwardBackward:
    """A forward pass's command put into Ray's object store once (its batch is over INLINE_BATCH_BYTES); every rank
    reads it from there. It keeps what the mailbox reads of a command: its request id (a cancelled one is replaced
    while no rank has taken it; a restart names it), and what the ranks key on before reading it: its model and
    `forward_pass`."""

    name: ClassVar[str] = "forward_backward"
    forward_pass: ClassVar[bool] = True
    model_id: str
    request_id: str
    ref: ray.ObjectRef  # -> the command (a PassCommand)

    def command(self) -> WorkerCommand:
        """The command, read from the object store (on a rank)."""
        command: WorkerCommand = ray.get(self.ref)
        return command


# What the mailbox carries to the ranks.
Shipped = WorkerCommand | StoredForwardBackward


def ship(cmd: WorkerCommand) -> Shipped:
    """A large batch goes into the object store once; a small one travels inside the message, which Ray inlines in
    the calls: no object store round trip before a rank starts."""
    if not runs_a_pass(cmd) or cmd.args.batch.nbytes <= INLINE_BATCH_BYTES:
        return cmd
    return StoredForwardBackward(cmd.model_id, cmd.request_id, ray.put(cmd))
