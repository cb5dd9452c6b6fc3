"""A forward(_backward) whose largest pass on a rank is estimated to need more activation memory than a rank has
(trainer.memory_per_worker_mib) is refused when the Trainer receives it, before any pass: run, it would kill the
training workers until it was given up (app.trainer.worker_deaths). The weights, optimizer state and allocator slack
come on top of the activations, so what passes here may still not fit; what is refused cannot."""

from __future__ import annotations

from app.errors import TooLargeForWorkers
from app.messages import SequencedOp
from app.operations import operation
from app.operations.forward_backward import ForwardBackward
from app.trainer.pass_sizing import PassSizing, size_text


def memory_refusal(op: SequencedOp, sizing: PassSizing) -> TooLargeForWorkers | None:
    """The error `op` fails with at once, or None when it may run (not a forward(_backward), fits, or the memory
    per worker or the estimate is unknown)."""
    budget_mib = sizing.shape.memory_per_worker_mib
    if budget_mib is None or sizing.activation_bytes is None or not isinstance(op, ForwardBackward):
        return None
    lengths = op.args.batch.lengths
    largest = sizing.largest_pass_tokens(lengths)
    backward = not op.args.forward_only
    needs = sizing.activation_bytes(largest, backward=backward)
    if needs <= budget_mib * 2**20:
        return None
    remedies = sizing.remedies(lengths, largest, backward, weights=False)
    remedies.append("or give each worker more memory and raise trainer.memory_per_worker_mib to match")
    return TooLargeForWorkers(
        f"{operation(op).name(op)} of {op.args.batch.num_tokens} tokens: its largest pass on a rank ({largest} tokens, "
        f"padding included) needs about {size_text(needs)} of activations, more than a training worker's memory "
        f"(trainer.memory_per_worker_mib: {budget_mib} MiB); it was not run. To fit: {'; '.join(remedies)}",
        field="data",
    )
