"""An operation that kills the training workers (too large for a rank's memory, most likely) fails instead of being
resent to kill them again, forever.

Each death of the workers is charged to the operations they were running (the mailbox names them); the journal counts
the charges (app.db.journal), so a replaced Trainer replica knows them too. One charged
timeouts.max_worker_deaths_per_operation times fails with a user error saying what to change.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping, Sequence

from app.config import TimeoutsConfig
from app.db.futures import FutureStore
from app.db.journal import JournalStore
from app.errors import TooLargeForWorkers
from app.messages import PingCommand, SequencedOp, WorkerCommand, runs_a_pass
from app.operations import operation
from app.request_log import log_request
from app.trainer.pass_sizing import PassSizing, size_text

logger = logging.getLogger("tinker_serve.trainer")


class WorkerDeaths:
    """A trainer's charging of worker deaths, and its giving up on the operations charged `limit` times
    (timeouts.max_worker_deaths_per_operation)."""

    def __init__(
        self,
        journal: JournalStore,
        futures: FutureStore,
        timeouts: TimeoutsConfig,
        sizing: PassSizing,
    ) -> None:
        self.limit = timeouts.max_worker_deaths_per_operation
        self._journal = journal
        self._futures = futures
        self._sizing = sizing

    async def charge(
        self,
        runs: Iterable[list[WorkerCommand]],
        running: Collection[str],
        ops: Mapping[str, tuple[str, SequencedOp]],
    ) -> set[str]:
        """Charge a death to the operations that were `running` in `runs` (the messages sent and not answered), and
        give up on those charged `limit` times: their commands in `runs` become no-ops (not resent) and their futures
        fail. `ops`: request id -> (model_id, op) of each operation sent. Returns the ids of those given up."""
        runs = list(runs)
        charged = [request_id for commands in runs for request_id in blamed(commands, running)]
        given_up: set[str] = set()
        for request_id, deaths in (await self._journal.charge_worker_death(charged)).items():
            if request_id in ops and deaths >= self.limit:
                await self.give_up(*ops[request_id], deaths)
                given_up.add(request_id)
        for commands in runs:
            commands[:] = [PingCommand() if c.request_id in given_up else c for c in commands]
        return given_up

    async def give_up(self, model_id: str, op: SequencedOp, deaths: int) -> None:
        """Fail an operation that was running each time the workers died, `deaths` times, saying what to change; its
        journal entry fails with its future, so no rebuild replays it and no new trainer reruns it."""
        error = too_large(op, deaths, self._sizing)
        await self._futures.fail(op.request_id, error.to_body())
        log_request(
            "given_up",
            op=operation(op).name(op),
            model_id=model_id,
            tinker_request_id=op.request_id,
            worker_deaths=deaths,
            outcome="user_error",
        )
        logger.warning("model %s: %s", model_id, error.message)


def blamed(commands: Sequence[WorkerCommand], running: Collection[str]) -> list[str]:
    """Of a run's commands (one message to the ranks), the request ids a death of the workers is charged to: of those
    that were running, the forward passes if any (their commands' `forward_pass`: they hold the activations, what
    outgrows a rank's memory), else every one."""
    ran = [c for c in commands if c.request_id and c.request_id in running]
    forwards = [c for c in ran if runs_a_pass(c)]
    return [c.request_id for c in forwards or ran]


def too_large(op: SequencedOp, deaths: int, sizing: PassSizing) -> TooLargeForWorkers:
    """The error of `op`, given up after the workers died `deaths` times while it ran: what happened, about what it
    needs, and what to change in the request or in the worker group (`sizing`'s)."""
    kind = operation(op)
    name, forward = kind.name(op), kind.forward(op)
    died = f"was running when the training workers died {_times(deaths)} (killed for memory, most likely)"
    if forward is None:
        return TooLargeForWorkers(
            f"{name} {died}; it was not run again. The server's logs say why the workers died (Ray's memory monitor "
            "names the worker it kills)"
        )
    batch = forward.batch
    largest = sizing.largest_pass_tokens(batch.lengths)
    backward = not forward.forward_only
    gradients = " and the model has no gradients from it" if backward else ""
    sentences = [
        f"{name} of {batch.num_tokens} tokens (its largest pass on a rank: {largest} tokens, padding included) "
        f"{died}; it was not run again{gradients}."
    ]
    if sizing.activation_bytes is not None:
        needs = sizing.activation_bytes(largest, backward=backward)
        sentences.append(f"That pass needs about {size_text(needs)} of activations.")
    remedies = sizing.remedies(batch.lengths, largest, backward, weights=True)
    sentences.append(f"To fit: {'; '.join([*remedies, 'or give each worker more memory'])}")
    return TooLargeForWorkers(" ".join(sentences), field="data")


def _times(count: int) -> str:
    return {1: "once", 2: "twice"}.get(count, f"{count} times")
