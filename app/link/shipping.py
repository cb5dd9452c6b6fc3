"""How a worker command travels to the ranks: inside the mailbox message, or, for a forward_backward whose batch is
large, through Ray's object store. Only the worker group's send ships (app.trainer.worker_group) and only a rank's
executor unwraps (app.ranks.execute): the Trainer sends and keeps plain commands (app.messages), whose batches are
PackedBatches."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import ray

from app.messages import ForwardBackwardCommand, WorkerCommand

# Below Ray's inlining limit for call arguments and return values (max_direct_call_object_size, 100 KiB): larger ones
# would go through the object store anyway, once more for every rank that takes the message.
INLINE_BATCH_BYTES = 64 * 1024


@dataclass(frozen=True)
class StoredForwardBackward:
    """A forward_backward put into Ray's object store once (its batch is over INLINE_BATCH_BYTES); every rank reads
    it from there. It keeps what the mailbox reads of a command: its request id (a cancelled one is replaced while
    no rank has taken it; a restart names it)."""

    name: ClassVar[str] = "forward_backward"
    model_id: str
    request_id: str
    ref: ray.ObjectRef  # -> the ForwardBackwardCommand

    def command(self) -> ForwardBackwardCommand:
        """The command, read from the object store (on a rank)."""
        command: ForwardBackwardCommand = ray.get(self.ref)
        return command


# What the mailbox carries to the ranks.
Shipped = WorkerCommand | StoredForwardBackward


def ship(cmd: WorkerCommand) -> Shipped:
    """A large batch goes into the object store once; a small one travels inside the message, which Ray inlines in
    the calls: no object store round trip before a rank starts."""
    if not isinstance(cmd, ForwardBackwardCommand) or cmd.args.batch.nbytes <= INLINE_BATCH_BYTES:
        return cmd
    return StoredForwardBackward(cmd.model_id, cmd.request_id, ray.put(cmd))
