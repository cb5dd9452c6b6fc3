"""The trainer's in-flight ledger (app.trainer.in_flight): dispatch numbers, sendings and their generations, what a
recovery resends, and which operations' outcomes are written or discarded (a real journal and futures for a death's
charge)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from app.config import TimeoutsConfig
from app.db.futures import Failed, FutureStore
from app.db.journal import JournalStore
from app.messages import AdamParams, OptimStepCommand, PingCommand, Replies, WorkerCommand
from app.operations.optim_step import OptimStep
from app.trainer.in_flight import InFlight
from app.trainer.worker_deaths import WorkerDeaths
from tests.conftest import run_on_db
from tests.unit.trainer.test_pass_sizing import sizing
from tests.unit.trainer.test_rebuild import OneRankGroup


class RecordingGroup(OneRankGroup):
    """One rank that answers every command with None at once, keeping each message it was sent."""

    def __init__(self) -> None:
        self.sent: list[list[WorkerCommand]] = []
        self.sendings: list[Coroutine[Any, Any, Replies]] = []

    def send(self, commands: Sequence[WorkerCommand]) -> Awaitable[Replies]:
        self.sent.append(list(commands))

        async def answer() -> Replies:
            return [[None] * len(commands)]

        self.sendings.append(answer())
        return self.sendings[-1]


def _step(model_id: str, request_id: str) -> OptimStepCommand:
    return OptimStepCommand(model_id, AdamParams(), request_id=request_id)


def _op(request_id: str) -> OptimStep:
    return OptimStep(request_id, AdamParams())


def test_runs_are_numbered_sent_under_the_generation_and_a_recovery_resends_the_unanswered_in_order() -> None:
    async def body() -> None:
        group, ledger = RecordingGroup(), InFlight()
        first = ledger.dispatch([_step("a", "r1")], group.send, [("a", _op("r1"))])
        empty = ledger.dispatch([], group.send, [])  # a run of Skips: nothing to answer
        held = ledger.dispatch([_step("b", "r2")], None, [("b", _op("r2"))])  # while a recovery runs: not sent
        assert (first, empty, held) == (0, 1, 2)
        assert not ledger.has_message(empty) and ledger.has_message(first) and ledger.has_message(held)
        assert group.sent == [[_step("a", "r1")]]

        sending, generation = ledger.take_sending(first)
        assert generation == 0 and await sending == [[None]]
        ledger.answered(first)
        assert ledger.take_sending(held) == (None, 0)  # its waiter waits for the recovery

        generation = ledger.new_generation()
        ledger.resend(group, generation)
        assert group.sent[1:] == [[_step("b", "r2")]]  # the answered run is not resent
        sending, resent_in = ledger.take_sending(held)
        assert resent_in == generation == ledger.generation == 1 and sending is not None
        assert await sending == [[None]]

    asyncio.run(body())


def test_a_recovery_resends_a_mixed_run_one_model_at_a_time_in_dispatch_order() -> None:
    async def body() -> None:
        group, ledger = RecordingGroup(), InFlight()
        for number in (0, 1):
            ledger.dispatch([_step("a", f"a{number}"), _step("b", f"b{number}")], None, [])
        ledger.resend(group, ledger.new_generation())
        assert group.sent == [[_step("a", "a0")], [_step("b", "b0")], [_step("a", "a1")], [_step("b", "b1")]]
        for number in (0, 1):
            sending, _ = ledger.take_sending(number)
            assert await sending == [[None, None]]  # one reply per command of the run, in its order

    asyncio.run(body())


def test_a_sending_never_awaited_is_closed_once_its_run_is_settled() -> None:
    async def body() -> None:
        group, ledger = RecordingGroup(), InFlight()
        number = ledger.dispatch([_step("a", "r1")], group.send, [])
        sending, _ = ledger.take_sending(number)
        await sending  # (the group restarted under it)
        ledger.resend(group, ledger.new_generation())  # then the recovery failed: its waiter never awaits this
        ledger.answered(number)
        assert inspect.getcoroutinestate(group.sendings[1]) == inspect.CORO_CLOSED
        assert not ledger.has_message(number)

    asyncio.run(body())


def test_a_cancelled_operation_s_outcome_is_discarded_and_an_abandoned_one_is_no_longer_running() -> None:
    ledger = InFlight()
    assert not ledger.cancel("r1")  # never sent: nothing to discard
    ledger.dispatch([_step("a", "r1"), _step("a", "r2")], None, [("a", _op("r1")), ("a", _op("r2"))])
    assert ledger.cancel("r1")
    assert not ledger.finish("r1")  # cancelled: not written
    assert ledger.finish("r2")
    assert not ledger.cancel("r2")  # written already
    ledger.dispatch([_step("a", "r3")], None, [("a", _op("r3"))])
    assert ledger.cancel("r3")
    ledger.abandon({"r3"})
    assert not ledger.cancel("r3") and ledger.finish("r3")


def test_a_death_charged_up_to_the_limit_gives_the_operation_up_and_discards_its_outcome(tmp_path: Path) -> None:
    async def body(db: AsyncEngine) -> None:
        futures, journal = FutureStore(db), JournalStore(db)
        timeouts = TimeoutsConfig(max_worker_deaths_per_operation=1)
        deaths = WorkerDeaths(journal, futures, timeouts, sizing(1))
        ledger, ops = InFlight(), {}
        for seq_id, name in ((1, "killer"), (2, "bystander")):
            request_id = (await futures.create("op", "a", seq_id))[0]
            ops[name] = _op(request_id)
            await journal.append("a", seq_id, ops[name])
        killer, bystander = ops["killer"].request_id, ops["bystander"].request_id
        message = [_step("a", killer), _step("a", bystander)]
        ledger.dispatch(message, None, [("a", op) for op in ops.values()])

        await ledger.charge(deaths, running={killer})
        assert message == [PingCommand(), _step("a", bystander)]  # not resent; the other still is
        assert not ledger.finish(killer) and ledger.finish(bystander)
        outcome = await futures.get(killer)
        assert isinstance(outcome, Failed) and "died once" in str(outcome.error)

    run_on_db(tmp_path / "db.sqlite", body)
