"""SeqScheduler: strict seq_id order, batching of ready ops, pipelined dispatch, failure handling."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from app.errors import UserError
from app.trainer.scheduling import AlreadySubmitted, SeqScheduler


class Recorder:
    """A run_batch that records each batch; it can hold the first batch until released, or raise."""

    def __init__(self, *, hold_first: bool = False, fail_on: set[str] | None = None) -> None:
        self.batches: list[list[str]] = []
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        if not hold_first:
            self.release.set()
        self.fail_on = fail_on or set()

    async def __call__(self, runs: list[tuple[str, list[str]]]) -> list[Any]:
        ((model_id, ops),) = runs  # one model's run at a time (nothing mixes)
        self.batches.append(list(ops))
        self.started.set()
        if len(self.batches) == 1:
            await self.release.wait()
        if self.fail_on & set(ops):
            raise RuntimeError(f"batch {ops} failed")
        return [f"{model_id}/{op}" for op in ops]


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_out_of_order_submits_run_in_seq_order() -> None:
    async def main() -> None:
        rec = Recorder()
        sched = SeqScheduler(rec)
        sched.open("m")
        t3 = asyncio.create_task(sched.submit("m", 3, "op3"))
        t2 = asyncio.create_task(sched.submit("m", 2, "op2"))
        await _settle()
        assert rec.batches == []  # seq 1 has not arrived; nothing runs, nothing deadlocks
        t1 = asyncio.create_task(sched.submit("m", 1, "op1"))
        assert await asyncio.wait_for(asyncio.gather(t1, t2, t3), 2) == ["m/op1", "m/op2", "m/op3"]
        assert [op for batch in rec.batches for op in batch] == ["op1", "op2", "op3"]
        assert rec.batches == [["op1", "op2", "op3"]]  # all three were waiting when 1 arrived

    asyncio.run(main())


def test_later_ops_are_dispatched_while_earlier_ones_run() -> None:
    """Pipelining: b and c are sent, in order, while a is still running; results still come back per op."""

    async def main() -> None:
        rec = Recorder(hold_first=True)
        sched = SeqScheduler(rec)
        sched.open("m")
        t1 = asyncio.create_task(sched.submit("m", 1, "a"))
        await asyncio.wait_for(rec.started.wait(), 2)  # batch [a] is running and held
        t2 = asyncio.create_task(sched.submit("m", 2, "b"))
        t3 = asyncio.create_task(sched.submit("m", 3, "c"))
        await _settle()
        assert rec.batches == [["a"], ["b"], ["c"]] and not t1.done()
        rec.release.set()
        assert await asyncio.wait_for(asyncio.gather(t1, t2, t3), 2) == ["m/a", "m/b", "m/c"]

    asyncio.run(main())


def test_open_with_next_seq_and_a_resubmit_is_a_repeat() -> None:
    """An ingress that hands an operation over again (after a client retry) must neither run it twice nor fail it:
    the scheduler says it has it, whether it ran, came before the first accepted seq_id, or still waits."""

    async def main() -> None:
        rec = Recorder()
        sched = SeqScheduler(rec)
        sched.open("m", next_seq=5)
        assert await sched.submit("m", 5, "x") == "m/x"
        for seq in (5, 4):  # executed, and before the first accepted seq_id
            with pytest.raises(AlreadySubmitted):
                await sched.submit("m", seq, "again")
        waiting = asyncio.create_task(sched.submit("m", 7, "y"))
        await _settle()
        with pytest.raises(AlreadySubmitted):  # a repeat of a queued op
            await sched.submit("m", 7, "y")
        assert rec.batches == [["x"]]
        sched.close("m", RuntimeError("bye"))
        with pytest.raises(RuntimeError):
            await waiting

    asyncio.run(main())


def test_unknown_model() -> None:
    async def main() -> None:
        sched = SeqScheduler(Recorder())
        with pytest.raises(UserError) as info:
            await sched.submit("nope", 1, "x")
        assert info.value.field == "model_id"

    asyncio.run(main())


def test_close_fails_queued_ops() -> None:
    async def main() -> None:
        rec = Recorder()
        sched = SeqScheduler(rec)
        sched.open("m")
        queued = [asyncio.create_task(sched.submit("m", s, f"op{s}")) for s in (2, 3)]
        await _settle()
        reason = RuntimeError("model unloaded")
        sched.close("m", reason)
        for task in queued:
            with pytest.raises(RuntimeError) as info:
                await task
            assert info.value is reason
        assert rec.batches == []
        with pytest.raises(UserError):
            await sched.submit("m", 1, "x")

    asyncio.run(main())


def test_failing_batch_fails_its_ops_and_later_batches_run() -> None:
    async def main() -> None:
        rec = Recorder(hold_first=True, fail_on={"b"})
        sched = SeqScheduler(rec)
        sched.open("m")
        t3 = asyncio.create_task(sched.submit("m", 3, "c"))
        t2 = asyncio.create_task(sched.submit("m", 2, "b"))
        await _settle()
        t1 = asyncio.create_task(sched.submit("m", 1, "a"))  # a, b, c leave together
        await asyncio.wait_for(rec.started.wait(), 2)
        rec.release.set()
        for task in (t1, t2, t3):  # the whole batch failed; every op learns why
            with pytest.raises(RuntimeError, match="failed"):
                await task
        assert await asyncio.wait_for(sched.submit("m", 4, "d"), 2) == "m/d"
        assert rec.batches == [["a", "b", "c"], ["d"]]

    asyncio.run(main())


def test_per_op_exception_results() -> None:
    async def main() -> None:
        async def run_batch(runs: list[tuple[str, list[int]]]) -> list[Any]:
            ops = [op for _, run in runs for op in run]
            return [ValueError(op) if op % 2 else op * 10 for op in ops]

        sched = SeqScheduler(run_batch)
        sched.open("m")
        results = await asyncio.gather(*(sched.submit("m", s, s) for s in (1, 2)), return_exceptions=True)
        assert isinstance(results[0], ValueError) and results[1] == 20

    asyncio.run(main())


def test_max_batch_respected() -> None:
    async def main() -> None:
        rec = Recorder()
        sched = SeqScheduler(rec, max_batch=2)
        sched.open("m")
        tasks = [asyncio.create_task(sched.submit("m", s, f"op{s}")) for s in (5, 4, 3, 2)]
        await _settle()
        tasks.append(asyncio.create_task(sched.submit("m", 1, "op1")))
        await asyncio.wait_for(asyncio.gather(*tasks), 2)
        assert rec.batches == [["op1", "op2"], ["op3", "op4"], ["op5"]]

    asyncio.run(main())


def test_models_are_independent() -> None:
    async def main() -> None:
        rec = Recorder()
        sched = SeqScheduler(rec)
        sched.open("a")
        sched.open("b")
        blocked = asyncio.create_task(sched.submit("a", 2, "a2"))
        assert await asyncio.wait_for(sched.submit("b", 1, "b1"), 2) == "b/b1"
        assert not blocked.done()
        assert await asyncio.wait_for(sched.submit("a", 1, "a1"), 2) == "a/a1"
        assert await blocked == "a/a2"

    asyncio.run(main())


def test_a_seq_id_that_never_arrives_is_skipped_after_the_gap_timeout() -> None:
    async def main() -> None:
        rec = Recorder()
        sched = SeqScheduler(rec, gap_timeout_s=0.2)
        sched.open("m")
        t3 = asyncio.create_task(sched.submit("m", 3, "op3"))  # seq 1 and 2 were rejected before being read
        await asyncio.sleep(0.05)
        assert rec.batches == [] and not t3.done()
        assert await asyncio.wait_for(t3, 2) == "m/op3"
        assert rec.batches == [["op3"]]
        with pytest.raises(UserError, match="seq_gap_timeout_seconds"):  # a straggler is refused, not run late
            await sched.submit("m", 1, "op1")
        with pytest.raises(AlreadySubmitted):  # op3 again is a repeat, not a straggler
            await sched.submit("m", 3, "op3")

    asyncio.run(main())


def test_a_gap_filled_in_time_is_not_skipped() -> None:
    async def main() -> None:
        rec = Recorder()
        sched = SeqScheduler(rec, gap_timeout_s=0.3)
        sched.open("m")
        t2 = asyncio.create_task(sched.submit("m", 2, "op2"))
        await asyncio.sleep(0.1)
        t1 = asyncio.create_task(sched.submit("m", 1, "op1"))
        assert await asyncio.wait_for(asyncio.gather(t1, t2), 2) == ["m/op1", "m/op2"]
        await asyncio.sleep(0.4)  # the cancelled timer must not fire and skip anything
        t3 = asyncio.create_task(sched.submit("m", 4, "op4"))
        await asyncio.sleep(0.1)
        assert not t3.done() and rec.batches == [["op1", "op2"]]
        t3.cancel()

    asyncio.run(main())


def test_later_submits_do_not_postpone_the_gap_skip() -> None:
    async def main() -> None:
        rec = Recorder()
        sched = SeqScheduler(rec, gap_timeout_s=0.3)
        sched.open("m")
        tasks = []
        for seq in (2, 3, 4, 5):  # a pipelining client keeps submitting behind the missing seq 1
            tasks.append(asyncio.create_task(sched.submit("m", seq, f"op{seq}")))
            await asyncio.sleep(0.1)
        assert await asyncio.wait_for(asyncio.gather(*tasks), 1) == ["m/op2", "m/op3", "m/op4", "m/op5"]

    asyncio.run(main())


def test_cancelled_ops_are_replaced_and_the_order_goes_on() -> None:
    """A waiting op and one still to arrive are replaced by their stand-ins; a dispatched one cannot be."""

    async def main() -> None:
        rec = Recorder(hold_first=True)
        sched = SeqScheduler(rec)
        sched.open("m")
        t1 = asyncio.create_task(sched.submit("m", 1, "op1"))
        await rec.started.wait()
        assert not sched.cancel("m", 1, "skip1")  # dispatched already
        t3 = asyncio.create_task(sched.submit("m", 3, "op3"))
        await _settle()
        assert sched.cancel("m", 3, "skip3")  # waiting behind the gap at 2
        assert sched.cancel("m", 2, "skip2")  # not arrived yet
        assert not sched.cancel("other", 2, "x")
        t2 = asyncio.create_task(sched.submit("m", 2, "op2"))
        t4 = asyncio.create_task(sched.submit("m", 4, "op4"))
        rec.release.set()
        results = await asyncio.wait_for(asyncio.gather(t1, t2, t3, t4), 2)
        assert results == ["m/op1", "m/skip2", "m/skip3", "m/op4"]
        assert [op for batch in rec.batches for op in batch] == ["op1", "skip2", "skip3", "op4"]

    asyncio.run(main())
