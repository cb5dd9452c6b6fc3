"""Fair share on a shared trainer: deficit round robin across users (by tokens), models taking turns within a user,
a bounded number of runs at the worker group, and each model's seq_id order kept."""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter
from collections.abc import Callable

import pytest

from app.trainer.fair_share import FairShare
from app.trainer.scheduling import SeqScheduler

Op = tuple[str, int, int]  # (model, seq_id, cost)


class Workers:
    """A dispatch whose runs finish only when the test says so, oldest first, as a worker group runs them."""

    def __init__(self) -> None:
        self.runs: list[list[Op]] = []  # each dispatch's ops
        self.models: list[list[str]] = []  # each dispatch's models (several: a mixed pass)
        self.heads: list[list[Op]] = []  # each dispatch's first op of each model's run
        self._pending: list[asyncio.Future] = []

    def __call__(self, runs: list[tuple[str, list[Op]]]) -> asyncio.Future:
        self.runs.append([op for _, ops in runs for op in ops])
        self.models.append([model_id for model_id, _ in runs])
        self.heads.append([ops[0] for _, ops in runs])
        fut = asyncio.get_running_loop().create_future()
        self._pending.append(fut)
        return fut

    @property
    def in_flight(self) -> int:
        return sum(not fut.done() for fut in self._pending)

    async def finish_one(self) -> None:
        fut = next(fut for fut in self._pending if not fut.done())
        fut.set_result([None] * len(self.runs[self._pending.index(fut)]))
        await _settle()

    async def finish_all(self) -> None:
        """Finish runs, oldest first, until none is in flight (finishing one may dispatch the next)."""
        while self.in_flight:
            await self.finish_one()

    def fail_oldest(self, exc: Exception) -> None:
        next(fut for fut in self._pending if not fut.done()).set_exception(exc)

    def order(self) -> list[Op]:
        return [op for run in self.runs for op in run]


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def _cost(op: Op) -> int:
    return op[2]


def _flood(sched: SeqScheduler, user: str, model: str, count: int, cost: int, first: int = 1) -> list[asyncio.Task]:
    return [
        asyncio.create_task(sched.submit(model, seq, (model, seq, cost), user)) for seq in range(first, first + count)
    ]


def test_a_single_op_waits_for_at_most_the_runs_in_flight_behind_a_flood() -> None:
    """A queues 20 steps (a forward_backward of 100 tokens and an optim_step); B's one forward_backward is the next
    run sent once a slot frees, and everything of A's still runs, in order."""

    async def main() -> None:
        workers = Workers()
        sched = SeqScheduler(workers, max_dispatched_runs=2, cost=_cost)
        sched.open("a")
        sched.open("b")
        flood = [
            asyncio.create_task(sched.submit("a", seq, ("a", seq, 100 if seq % 2 else 8), "alice"))
            for seq in range(1, 41)
        ]
        await _settle()
        assert len(workers.runs) == 2 and workers.in_flight == 2  # the depth is bounded; 38 wait here
        assert sched.waiting("a") == 38
        single = asyncio.create_task(sched.submit("b", 1, ("b", 1, 100), "bob"))
        await _settle()
        assert len(workers.runs) == 2
        while not single.done() or workers.in_flight:
            await workers.finish_one()
            assert workers.in_flight <= 2
        order = workers.order()
        assert order.index(("b", 1, 100)) == 2  # right after the two runs that were in flight when it came
        assert [seq for model, seq, _ in order if model == "a"] == list(range(1, 41))
        await asyncio.gather(*flood, single)

    asyncio.run(main())


def test_extra_credit_sends_whole_steps_and_the_single_op_still_goes_next() -> None:
    """With extra credit the size of an optim_step (the Trainer's setting), each of A's runs is a whole step
    (forward_backward + optim_step), and B's op is still the first run after the two in flight."""

    async def main() -> None:
        workers = Workers()
        sched = SeqScheduler(workers, max_dispatched_runs=2, cost=_cost, extra_credit=8)
        sched.open("a")
        sched.open("b")
        flood = [
            asyncio.create_task(sched.submit("a", seq, ("a", seq, 100 if seq % 2 else 8), "alice"))
            for seq in range(1, 41)
        ]
        await _settle()
        single = asyncio.create_task(sched.submit("b", 1, ("b", 1, 100), "bob"))
        await _settle()
        await workers.finish_all()
        assert workers.runs[2] == [("b", 1, 100)]
        alice_runs = [run for run in workers.runs if run[0][0] == "a"]
        # the first two left alone, as soon as they arrived (slots were free); then whole steps
        assert [[seq for _, seq, _ in run] for run in alice_runs] == [[1], [2]] + [[s, s + 1] for s in range(3, 41, 2)]
        await asyncio.gather(*flood, single)

    asyncio.run(main())


@pytest.mark.parametrize("extra", [0, 8, 25])
def test_users_share_by_tokens_whatever_their_op_sizes(extra: int) -> None:
    """Two flooders, one with 10-token ops and one with 30-token ops: each gets the same tokens of worker time
    (within one op), so the small-op user runs three ops for each of the other's."""

    async def main() -> None:
        workers = Workers()
        sched = SeqScheduler(workers, max_dispatched_runs=1, cost=_cost, extra_credit=extra)
        sched.open("small")
        sched.open("big")
        tasks = _flood(sched, "u1", "small", 90, 10) + _flood(sched, "u2", "big", 30, 30)
        await _settle()
        for _ in range(40):
            await workers.finish_one()
        served = Counter[str]()
        for model, _, cost in workers.order()[:40]:
            served[model] += cost
        assert abs(served["small"] - served["big"]) <= 30 + extra, served
        await workers.finish_all()
        await asyncio.gather(*tasks)

    asyncio.run(main())


def test_a_users_models_take_turns_and_users_alternate() -> None:
    async def main() -> None:
        workers = Workers()
        sched = SeqScheduler(workers, max_dispatched_runs=1, cost=_cost)
        for model in ("a1", "a2", "b1"):
            sched.open(model)
        tasks = (
            _flood(sched, "alice", "a1", 4, 5) + _flood(sched, "alice", "a2", 4, 5) + _flood(sched, "bob", "b1", 8, 5)
        )
        await _settle()
        await workers.finish_all()
        users = ["alice" if model.startswith("a") else "bob" for model, _, _ in workers.order()]
        assert users[:12] == ["alice", "bob"] * 6
        alice_models = [model for model, _, _ in workers.order() if model.startswith("a")]
        assert alice_models == ["a1", "a2"] * 4
        await asyncio.gather(*tasks)

    asyncio.run(main())


def test_credit_lets_a_run_carry_several_ops_and_skips_cost_nothing() -> None:
    async def main() -> None:
        workers = Workers()
        sched = SeqScheduler(workers, max_dispatched_runs=1, cost=_cost)
        sched.open("m")
        first = asyncio.create_task(sched.submit("m", 1, ("m", 1, 50), "u"))
        await _settle()
        rest = [asyncio.create_task(sched.submit("m", s, ("m", s, c), "u")) for s, c in ((2, 10), (3, 0), (4, 0))]
        await _settle()
        await workers.finish_all()
        # alone, a user is granted exactly its next op's cost: the free ops ride along with it, not with the next
        assert workers.runs == [[("m", 1, 50)], [("m", 2, 10), ("m", 3, 0), ("m", 4, 0)]]
        await asyncio.gather(first, *rest)

    asyncio.run(main())


@pytest.mark.parametrize("seed", range(20))
def test_random_arrivals_keep_every_models_order_and_lose_nothing(seed: int) -> None:
    rng = random.Random(seed)

    async def main() -> None:
        workers = Workers()
        sched = SeqScheduler(workers, max_dispatched_runs=rng.randint(1, 3), max_batch=rng.randint(1, 4), cost=_cost)
        models = {f"m{i}": f"u{rng.randint(0, 2)}" for i in range(5)}
        for model in models:
            sched.open(model)
        arrivals = [(model, seq) for model in models for seq in range(1, rng.randint(2, 12))]
        rng.shuffle(arrivals)
        tasks = []
        for model, seq in arrivals:
            tasks.append(
                asyncio.create_task(sched.submit(model, seq, (model, seq, rng.choice([0, 8, 100])), models[model]))
            )
            if rng.random() < 0.3:
                await _settle()
                if workers.in_flight:
                    await workers.finish_one()
        await _settle()
        await workers.finish_all()
        await asyncio.wait_for(asyncio.gather(*tasks), 2)
        order = workers.order()
        assert sorted((m, s) for m, s, _ in order) == sorted(arrivals)
        for model in models:
            seqs = [s for m, s, _ in order if m == model]
            assert seqs == sorted(seqs)

    asyncio.run(main())


def test_cancel_close_and_failures_while_waiting_for_a_slot(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        workers = Workers()
        sched = SeqScheduler(workers, max_dispatched_runs=1, cost=_cost, gap_timeout_s=0.05)
        sched.open("a")
        sched.open("b")
        a_ops = _flood(sched, "alice", "a", 3, 10)
        b_ops = _flood(sched, "bob", "b", 2, 10)
        await _settle()
        assert workers.in_flight == 1
        assert sched.cancel("a", 3, ("a", 3, 0))  # waiting for a slot: it becomes its stand-in
        await asyncio.sleep(0.1)  # longer than the gap timeout: ready ops waiting for a slot are no gap
        sched.close("b", RuntimeError("unloaded"))  # bob's model goes while its ops wait for a slot
        for task in b_ops:
            with pytest.raises(RuntimeError, match="unloaded"):
                await task
        assert workers.runs == [[("a", 1, 10)]]
        workers.fail_oldest(RuntimeError("group restarted"))  # a failed run frees its slot too
        await _settle()
        with pytest.raises(RuntimeError, match="group restarted"):
            await a_ops[0]
        await workers.finish_all()
        assert workers.runs == [[("a", 1, 10)], [("a", 2, 10), ("a", 3, 0)]]  # the free stand-in rides along
        await asyncio.gather(*a_ops[1:])

    caplog.set_level(logging.WARNING, "tinker_serve.scheduling")
    asyncio.run(main())
    assert not [r for r in caplog.records if "never arrived" in r.getMessage()]


def test_fair_share_newcomer_goes_first_and_idle_users_lose_credit() -> None:
    fair = FairShare()
    costs = {"a": 10, "b": 10}
    assert fair.pick({"alice": ["a"]}, costs.__getitem__) == ("alice", "a", 10)
    fair.charge("alice", "a", 4)  # spent less than its credit: 6 left
    assert fair.pick({"alice": ["a"], "bob": ["b"]}, costs.__getitem__) == ("alice", "a", 10)  # 4 more each
    fair.charge("alice", "a", 10)
    assert fair.pick({"alice": ["a"], "bob": ["b"]}, costs.__getitem__) == ("bob", "b", 10)
    fair.charge("bob", "b", 10)
    assert fair.pick({"bob": ["b"]}, costs.__getitem__) == ("bob", "b", 10)  # alice idle: she left the round
    fair.charge("bob", "b", 10)
    assert fair.pick({"alice": ["a"], "bob": ["b"]}, costs.__getitem__)[0] == "alice"  # back, first in the round


def test_a_debt_for_compute_beyond_tokens_is_paid_even_across_idle_time() -> None:
    """A custom loss's compute is debited once it ran: its user waits while others are served that much, even
    after going idle in between (a debt is not forgotten as unused credit is)."""
    fair = FairShare()
    costs = {"a": 10, "b": 10}
    assert fair.pick({"alice": ["a"]}, costs.__getitem__)[0] == "alice"
    fair.charge("alice", "a", 10)
    fair.debit("alice", 35)  # the op cost 35 tokens of compute beyond its 10 tokens
    assert fair.pick({"bob": ["b"]}, costs.__getitem__)[0] == "bob"  # alice idle meanwhile
    fair.charge("bob", "b", 10)
    served = []
    for _ in range(5):
        user, model, _ = fair.pick({"alice": ["a"], "bob": ["b"]}, costs.__getitem__)
        fair.charge(user, model, 10)
        served.append(user)
    assert served == ["bob", "bob", "bob", "bob", "alice"]  # bob's 40 tokens pay for alice's 35 first


def test_unbounded_depth_sends_in_arrival_order() -> None:
    """Without a bound (today's pipelining) nothing waits for a slot: the order is the order ops became ready."""

    async def main() -> None:
        workers = Workers()
        sched = SeqScheduler(workers, cost=_cost)
        sched.open("a")
        sched.open("b")
        tasks = _flood(sched, "alice", "a", 5, 10)
        await _settle()
        tasks.append(asyncio.create_task(sched.submit("b", 1, ("b", 1, 10), "bob")))
        await _settle()
        assert [op[0] for op in workers.order()] == ["a"] * 5 + ["b"]
        await workers.finish_all()
        await asyncio.gather(*tasks)

    asyncio.run(main())


def _forwards_mix(limit: int) -> Callable[[list[Op]], bool]:
    """The Trainer's rule in miniature: up to `limit` heads mix, forward_backwards only (ops costing over 8)."""
    return lambda heads: len(heads) <= limit and all(cost > 8 for _, _, cost in heads)


def test_ready_forwards_of_many_models_go_as_one_pass_in_each_models_order() -> None:
    """8 users step at once (a forward_backward of 100 tokens and an optim_step, 3 steps each): each dispatch carries
    up to 4 models' runs, each opening with a forward_backward; every model's ops still run in seq_id order."""

    async def main() -> None:
        workers = Workers()
        sched = SeqScheduler(workers, max_dispatched_runs=1, cost=_cost, extra_credit=8, mixes=_forwards_mix(4))
        tasks = []
        for user in range(8):
            sched.open(f"m{user}")
            tasks += [
                asyncio.create_task(sched.submit(f"m{user}", seq, (f"m{user}", seq, 100 if seq % 2 else 8), f"u{user}"))
                for seq in range(1, 7)
            ]
        await _settle()
        await workers.finish_all()
        await asyncio.gather(*tasks)
        assert max(len(models) for models in workers.models) == 4
        assert len(workers.runs) <= 8  # 24 steps (alone: 24 dispatches); the first went before the others came
        for heads, models in zip(workers.heads, workers.models, strict=True):
            assert len(set(models)) == len(models)  # a model at most once a pass
            assert len(models) == 1 or all(cost == 100 for _, _, cost in heads)  # passes open with forward_backwards
        for user in range(8):
            assert [seq for model, seq, _ in workers.order() if model == f"m{user}"] == list(range(1, 7))

    asyncio.run(main())


def test_mixing_gives_no_user_more_for_splitting_work_across_models() -> None:
    """Alice floods from 4 models, Bob from 1; passes hold 2 models' runs. Each op is charged its own tokens as if it
    ran alone, so both are served the same tokens, within one op, however Alice splits hers."""

    async def main() -> None:
        workers = Workers()
        sched = SeqScheduler(workers, max_dispatched_runs=1, cost=_cost, mixes=_forwards_mix(2))
        tasks = []
        for model in ("a1", "a2", "a3", "a4", "b"):
            sched.open(model)
            user = "bob" if model == "b" else "alice"
            tasks += _flood(sched, user, model, 10, 100)
        await _settle()
        for _ in range(10):
            await workers.finish_one()
        served = {"alice": 0, "bob": 0}
        for model, _, cost in workers.order():
            served["bob" if model == "b" else "alice"] += cost
        assert served["bob"] > 0 and abs(served["alice"] - served["bob"]) <= 100
        await workers.finish_all()
        await asyncio.gather(*tasks)

    asyncio.run(main())
