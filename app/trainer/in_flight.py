"""A trainer's ledger of what it sent the workers and has not settled, the bookkeeping its recovery works from.

Runs: each dispatched run has a dispatch number; its message is kept until the workers answer it, with its latest
sending and the generation (recoveries started so far) it was sent in. A recovery starts a new generation, then
resends every unanswered message in dispatch order: a run's waiter that sees the group restart under a sending of
an older generation waits for that recovery instead of starting one.

Operations: each one sent, by request id, with its model, until its outcome is written; the cancelled ones among
them (by the user, or given up after killing the workers) have their outcome discarded, their futures say so.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence

from app.messages import Replies, SequencedOp, WorkerCommand
from app.trainer.recovery import resend
from app.trainer.worker_deaths import WorkerDeaths
from app.trainer.worker_group import WorkerGroup

Send = Callable[[Sequence[WorkerCommand]], Awaitable[Replies]]
Sending = tuple[Awaitable[Replies] | None, int]  # (the latest sending of a run, None if not yet; its generation)


class InFlight:
    def __init__(self) -> None:
        self.generation = 0  # recoveries started: a run sent before the latest one is resent by it
        self._numbers = itertools.count()
        self._unanswered: dict[int, list[WorkerCommand]] = {}  # dispatch number -> the run's message
        self._sent: dict[int, Sending] = {}
        self._running: dict[str, tuple[str, SequencedOp]] = {}  # request id -> (model_id, op): outcome not written
        self._cancelled: set[str] = set()  # of those, the ones whose outcome is discarded

    def dispatch(self, message: list[WorkerCommand], send: Send | None, ops: Iterable[tuple[str, SequencedOp]]) -> int:
        """Number a run and keep its message (if any) until it is answered; `send` sends it now (None: the recovery
        in progress sends it, or no one: the trainer stops). `ops`: (model_id, op) of each operation it runs.
        Returns its dispatch number."""
        number = next(self._numbers)
        if message:
            self._unanswered[number] = message
            self._sent[number] = (send(message) if send is not None else None, self.generation)
        self._running.update((op.request_id, (model_id, op)) for model_id, op in ops)
        return number

    def has_message(self, number: int) -> bool:
        """Whether run `number` sent the workers anything to answer (a run of Skips only does not)."""
        return number in self._sent

    def take_sending(self, number: int) -> Sending:
        """Run `number`'s latest sending and its generation, for its waiter to await; a recovery puts its next."""
        return self._sent.pop(number)

    def answered(self, number: int) -> None:
        """Run `number` is settled (answered, or its waiter failed): its message is forgotten. A sending never
        awaited (resent by a recovery that then failed) is closed."""
        self._unanswered.pop(number, None)
        dropped, _ = self._sent.pop(number, (None, 0))
        if inspect.iscoroutine(dropped):
            dropped.close()

    def abandon(self, request_ids: Collection[str]) -> None:
        """These operations' run failed as a whole: none of them is running any more."""
        for request_id in request_ids:
            self._running.pop(request_id, None)
            self._cancelled.discard(request_id)

    def cancel(self, request_id: str) -> bool:
        """Discard the outcome of `request_id` if it was sent and is not yet written; whether it was."""
        if request_id not in self._running:
            return False
        self._cancelled.add(request_id)
        return True

    def finish(self, request_id: str) -> bool:
        """The operation's outcome is about to be written: whether to write it (not if it was cancelled)."""
        self._running.pop(request_id, None)
        if request_id in self._cancelled:
            self._cancelled.discard(request_id)
            return False
        return True

    async def charge(self, deaths: WorkerDeaths, running: Collection[str]) -> None:
        """Charge a death of the workers to the operations that were `running` in the unanswered runs; those given up
        become no-ops in their messages and their outcomes are discarded (app.trainer.worker_deaths)."""
        self._cancelled |= await deaths.charge(self._unanswered.values(), running, self._running)

    def new_generation(self) -> int:
        """A recovery starts: the generation it resends under."""
        self.generation += 1
        return self.generation

    def resend(self, group: WorkerGroup, generation: int) -> None:
        """Send every unanswered run again, in dispatch order, as sent in `generation` (app.trainer.recovery.resend)."""
        for number, sending in resend(group, self._unanswered).items():
            self._sent[number] = (sending, generation)
