"""A forward_backward that fails on one rank of two leaves no gradients on any rank: the next optim_step trains the
model exactly as if the failed operation had never been sent (real gloo ranks, a replicated base)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from app.errors import TinkerServeError
from tests.conftest import TINY_MODEL
from tests.unit.training.sharded_ranks import ADAM, POLICY, batch_of, engine_on, run_ranks

LENGTHS = [7, 9, 5, 11]  # rank 0 gets datums 0 and 2, rank 1 datums 1 and 3


def train(rank: int, world: int) -> dict[str, Any]:
    """Two models trained two steps of one good forward_backward each; before each optim_step, the second is also
    sent a forward_backward whose target token on rank 1's datum is outside the vocabulary."""
    engine = engine_on(TINY_MODEL, rank, world, sharding="replicate", micro_batch_tokens=16384)
    engine.create_model("undisturbed", POLICY)
    engine.create_model("disturbed", POLICY)
    failures = []
    for step in range(2):
        for model in ("undisturbed", "disturbed"):
            engine.forward_backward(model, "cross_entropy", {}, batch_of(LENGTHS, seed=step), False)
        bad = batch_of(LENGTHS, seed=10 + step)
        bad.loss_inputs["target_tokens"][LENGTHS[0]] = 10**6  # datum 1's first target
        try:
            engine.forward_backward("disturbed", "cross_entropy", {}, bad, False)
            failures.append(None)
        except (TinkerServeError, RuntimeError, IndexError) as exc:
            failures.append(type(exc).__name__)
        for model in ("undisturbed", "disturbed"):
            engine.optim_step(model, ADAM)
    adapters = {model: engine.adapter_state(model) for model in ("undisturbed", "disturbed")}
    return {"failures": failures, **{m: {k: v.numpy() for k, v in a.items()} for m, a in adapters.items()}}


@pytest.mark.timeout(300)
def test_a_failed_forward_backward_adds_no_gradient_on_any_rank() -> None:
    ranks = run_ranks(train)
    assert ranks[0]["failures"] == [None, None]  # rank 0's datums were fine
    assert all(name is not None for name in ranks[1]["failures"])  # rank 1's failed
    for rank in ranks:  # the parameters' names differ by the models' adapter names only
        undisturbed, disturbed = (sorted(rank[model].items()) for model in ("undisturbed", "disturbed"))
        assert len(undisturbed) == len(disturbed) > 0
        for (name, weights), (_, other) in zip(undisturbed, disturbed, strict=True):
            np.testing.assert_array_equal(other, weights, err_msg=name)
