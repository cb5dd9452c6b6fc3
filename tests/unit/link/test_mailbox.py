"""Mailbox as a plain asyncio object: fan-out to every rank, rank-ordered replies, restarts, timeouts, stop."""

from __future__ import annotations

import asyncio
import pickle

import pytest

from app.errors import GroupRestarted
from app.link.mailbox import Mailbox, Stop
from app.messages import AdamParams, OptimStepCommand, PingCommand, RemoveModelCommand, SnapshotCommand


def _msg(name: str) -> list[RemoveModelCommand]:
    """A message of one command that serves no request, told apart by `name`."""
    return [RemoveModelCommand(name)]


def _serving(request_id: str) -> OptimStepCommand:
    """A command that serves the request `request_id`."""
    return OptimStepCommand("m", AdamParams(), request_id=request_id)


async def _registered(world_size: int) -> Mailbox:
    box = Mailbox(world_size)
    for rank in range(world_size):
        await box.register(rank, f"proc-{rank}")
    return box


def test_call_fans_out_and_orders_replies_by_rank() -> None:
    async def main() -> None:
        box = await _registered(3)
        call = asyncio.create_task(box.call(1, [PingCommand()]))
        received = [await box.next(rank, timeout_s=1.0) for rank in range(3)]
        assert received == [(1, [PingCommand()])] * 3
        for rank in (2, 0, 1):  # replies arrive out of rank order
            assert not call.done()
            await box.reply(1, rank, [100 + rank])
        assert await asyncio.wait_for(call, 1.0) == [[100], [101], [102]]
        assert await box.status() == {"registered": 3, "world_size": 3, "restarts": 0}
        assert await box.identities() == {0: "proc-0", 1: "proc-1", 2: "proc-2"}

    asyncio.run(main())


def test_messages_stay_in_order_per_rank() -> None:
    async def main() -> None:
        box = await _registered(2)
        calls = [asyncio.create_task(box.call(i, _msg(f"m{i}"))) for i in (1, 2)]
        await asyncio.sleep(0)
        for rank in range(2):
            assert [await box.next(rank, 1.0) for _ in range(2)] == [(1, _msg("m1")), (2, _msg("m2"))]
        for msg_id in (2, 1):
            for rank in range(2):
                await box.reply(msg_id, rank, [msg_id, rank])
        assert await asyncio.gather(*calls) == [[[1, 0], [1, 1]], [[2, 0], [2, 1]]]

    asyncio.run(main())


def test_calls_run_out_of_order_still_queue_messages_in_msg_id_order() -> None:
    """Ray runs an async actor's calls out of order: message 2's call may run before message 1's. Every rank still
    gets message 1 first (a model's operations run in the order they were sent)."""

    async def main() -> None:
        box = await _registered(2)
        second = asyncio.create_task(box.call(2, _msg("m2")))
        await asyncio.sleep(0.01)
        assert await box.next(0, 0.01) is None  # message 2 waits for message 1
        first = asyncio.create_task(box.call(1, _msg("m1")))
        for rank in range(2):
            assert [await box.next(rank, 1.0) for _ in range(2)] == [(1, _msg("m1")), (2, _msg("m2"))]
            for msg_id in (1, 2):
                await box.reply(msg_id, rank, [rank])
        assert await asyncio.gather(first, second) == [[[0], [1]], [[0], [1]]]

    asyncio.run(main())


def test_a_message_that_never_comes_holds_up_the_next_only_for_a_while(monkeypatch) -> None:
    monkeypatch.setattr("app.link.mailbox.MESSAGE_GAP_TIMEOUT_S", 0.05)

    async def main() -> None:
        box = await _registered(1)
        call = asyncio.create_task(box.call(2, _msg("m2")))  # message 1's sending failed
        assert await box.next(0, 1.0) == (2, _msg("m2"))
        await box.reply(2, 0, [None])
        assert await call == [[None]]

    asyncio.run(main())


def test_next_delivers_the_answer_to_the_last_message_first() -> None:
    async def main() -> None:
        box = await _registered(2)
        first, second = (asyncio.create_task(box.call(i, _msg(f"m{i}"))) for i in (1, 2))
        await asyncio.sleep(0)
        assert [await box.next(rank, 1.0) for rank in range(2)] == [(1, _msg("m1"))] * 2
        assert await box.next(0, 1.0, answer=(1, [10])) == (2, _msg("m2"))
        assert not first.done()  # rank 1 has not answered yet
        assert await box.next(1, 1.0, answer=(1, [11])) == (2, _msg("m2"))
        assert await asyncio.wait_for(first, 1.0) == [[10], [11]]
        for rank in range(2):  # the answer still arrives when no message follows in time
            assert await box.next(rank, 0.01, answer=(2, [20 + rank])) is None
        assert await asyncio.wait_for(second, 1.0) == [[20], [21]]

    asyncio.run(main())


def test_reregistering_with_new_identity_fails_pending_calls() -> None:
    async def main() -> None:
        box = await _registered(2)
        call = asyncio.create_task(box.call(1, [_serving("work")]))
        assert await box.next(0, 1.0) == (1, [_serving("work")])
        await box.reply(1, 0, [{"loss": 1.0}])
        await box.register(1, "proc-1")  # same identity: not a restart
        assert not call.done()
        await box.register(1, "proc-1-restarted")
        with pytest.raises(GroupRestarted) as info:
            await asyncio.wait_for(call, 1.0)
        assert info.value.category == "server" and info.value.status_code == 500
        assert await box.status() == {"registered": 1, "world_size": 2, "restarts": 1}
        # The old message is gone from the fresh queues, and a late reply is ignored.
        assert await box.next(1, timeout_s=0.05) is None
        await box.reply(1, 1, [{"loss": 1.0}])
        # The restarted group serves new calls.
        await box.register(0, "proc-0-restarted")
        again = asyncio.create_task(box.call(2, _msg("again")))
        for rank in range(2):
            assert await box.next(rank, 1.0) == (2, _msg("again"))
            await box.reply(2, rank, [rank])
        assert await again == [[0], [1]]

    asyncio.run(main())


def test_next_times_out_with_none() -> None:
    async def main() -> float:
        box = await _registered(1)
        loop = asyncio.get_running_loop()
        start = loop.time()
        assert await box.next(0, timeout_s=0.1) is None
        return loop.time() - start

    assert 0.09 <= asyncio.run(main()) < 1.0


def test_stop_reaches_every_rank() -> None:
    async def main() -> None:
        box = await _registered(2)
        await box.stop()
        assert [await box.next(r, 1.0) for r in range(2)] == [Stop(), Stop()]

    asyncio.run(main())


def test_cancel_replaces_commands_only_while_no_rank_has_taken_them() -> None:
    async def main() -> None:
        box = await _registered(2)
        first, second = [_serving("a")], [_serving("b"), _serving("c")]
        calls = [asyncio.create_task(box.call(i, cmds)) for i, cmds in ((1, first), (2, second))]
        await asyncio.sleep(0)
        taken = await box.next(0, 1.0)  # rank 0 took message 1: it runs as it is on every rank
        assert not await box.cancel("a", PingCommand())
        assert await box.cancel("c", PingCommand())
        assert not await box.cancel("unknown", PingCommand())
        assert taken == (1, [_serving("a")])
        assert await box.next(1, 1.0) == (1, [_serving("a")])
        for rank in range(2):
            assert await box.next(rank, 1.0) == (2, [_serving("b"), PingCommand()])
        for msg_id in (1, 2):
            for rank in range(2):
                await box.reply(msg_id, rank, [rank])
        await asyncio.gather(*calls)

    asyncio.run(main())


def test_a_restart_names_the_commands_the_ranks_were_running() -> None:
    """Taken and unanswered by some rank: running. Answered by every rank that took it, or taken by none: not."""

    async def main() -> None:
        box = await _registered(2)
        snapshot = SnapshotCommand("m", "m/snapshots/1")  # serves no request
        messages = {1: [_serving("done")], 2: [_serving("a"), snapshot], 3: [_serving("b")], 4: [_serving("queued")]}
        calls = [asyncio.create_task(box.call(i, cmds)) for i, cmds in messages.items()]
        await asyncio.sleep(0)
        assert await box.running() == ()
        for rank in range(2):  # both run message 1 and answer it
            assert (await box.next(rank, 1.0))[0] == 1
        assert await box.running() == ("done",)
        assert (await box.next(0, 1.0, answer=(1, [10])))[0] == 2
        assert (await box.next(1, 1.0, answer=(1, [11])))[0] == 2
        assert await box.running() == ("a",)  # a command serving no request has no id to name
        assert (await box.next(0, 1.0, answer=(2, [20, None])))[0] == 3  # rank 0 is ahead; rank 1 still runs message 2
        assert await box.running() == ("a", "b")  # oldest first
        await box.register(1, "proc-1-restarted")
        assert await calls[0] == [[10], [11]]
        for call in calls[1:]:  # every pending message, message 4 that no rank took included
            with pytest.raises(GroupRestarted) as info:
                await asyncio.wait_for(call, 1.0)
            assert info.value.running == ("a", "b")
        assert await box.running() == ()

    asyncio.run(main())


def test_group_restarted_keeps_what_was_running_across_pickling() -> None:
    """Ray pickles the error from the mailbox actor to the trainer; its Tinker error body is unchanged by it."""
    error = pickle.loads(pickle.dumps(GroupRestarted("gone", running=("a", "b"))))
    assert error.running == ("a", "b") and error.to_body() == {"error": "gone", "category": "server"}
    assert GroupRestarted("stale").running == ()
