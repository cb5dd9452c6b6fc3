"""Critic models in the TrainingEngine: a LoRA adapter plus a value head, trained with the clipped value loss."""

from __future__ import annotations

import numpy as np
import pytest

from app.messages import AdamParams, AdapterSpec
from app.training.base_model import load_base_model
from app.training.engine import TrainingEngine
from app.training_data.batch import PackedBatch
from app.training_data.sharding import merge_shards
from tests.conftest import TINY_MODEL
from tests.tolerances import assert_sums_close, network_terms

VOCAB = 2048
CRITIC = AdapterSpec(rank=8, seed=11, role="critic")
POLICY = AdapterSpec(rank=8, seed=11)


@pytest.fixture(scope="module")
def engine() -> TrainingEngine:
    return TrainingEngine(load_base_model(str(TINY_MODEL)))


def tokens_batch(lengths: list[int], seed: int = 0, **inputs: np.ndarray) -> PackedBatch:
    rng = np.random.default_rng(seed)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return PackedBatch(rng.integers(3, VOCAB, sum(lengths), dtype=np.int64), offsets, inputs)


def parity_returns(batch: PackedBatch) -> np.ndarray:
    """A value target the critic can learn from the current token: +1 on even ids, -1 on odd ones."""
    return np.where(batch.tokens % 2 == 0, 1.0, -1.0).astype(np.float32)


def values_of(engine: TrainingEngine, model_id: str, batch: PackedBatch) -> np.ndarray:
    bare = PackedBatch(batch.tokens, batch.offsets, {})
    result = engine.forward_backward(model_id, "ppo_critic", {"value_clip": 0.2}, bare, forward_only=True)
    return result.outputs["values"]


def test_fresh_critic_predicts_zero_values_only(engine: TrainingEngine) -> None:
    engine.create_model("critic-fresh", CRITIC)
    batch = tokens_batch([4, 6])
    out = engine.forward_backward(
        "critic-fresh",
        "ppo_critic",
        {"value_clip": 0.2},
        PackedBatch(batch.tokens, batch.offsets, {}),
        forward_only=True,
    )
    assert set(out.outputs) == {"values"}
    np.testing.assert_array_equal(out.outputs["values"], np.zeros(10, np.float32))
    assert out.loss_sum == 0.0
    state = engine.adapter_state("critic-fresh")
    assert {"value_head.weight", "value_head.bias"} <= state.keys()
    assert any("lora_A" in k for k in state)


def test_value_loss_matches_its_formula(engine: TrainingEngine) -> None:
    engine.create_model("critic-formula", CRITIC)
    batch = tokens_batch([5, 3], seed=1)
    for _ in range(3):  # move the values away from zero so both clip branches are reachable
        target = PackedBatch(
            batch.tokens,
            batch.offsets,
            {"values": values_of(engine, "critic-formula", batch), "returns": parity_returns(batch)},
        )
        engine.forward_backward("critic-formula", "ppo_critic", {"value_clip": 100.0}, target, forward_only=False)
        engine.optim_step("critic-formula", AdamParams(learning_rate=5e-2))
    v = values_of(engine, "critic-formula", batch).astype(np.float64)
    rng = np.random.default_rng(2)
    old = (v + rng.uniform(-0.5, 0.5, v.shape)).astype(np.float32)
    returns, weights = parity_returns(batch), rng.uniform(0.0, 2.0, v.shape).astype(np.float32)
    clip = 0.1
    out = engine.forward_backward(
        "critic-formula",
        "ppo_critic",
        {"value_clip": clip},
        PackedBatch(batch.tokens, batch.offsets, {"values": old, "returns": returns, "weights": weights}),
        forward_only=True,
    )
    clipped = old + np.clip(v - old, -clip, clip)
    unclipped_err, clipped_err = (v - returns) ** 2, (clipped - returns) ** 2
    assert (clipped_err > unclipped_err).any() and (clipped_err < unclipped_err).any()  # both branches used
    expected = 0.5 * weights * np.maximum(unclipped_err, clipped_err)
    np.testing.assert_allclose(out.outputs["elementwise_loss"], expected, rtol=1e-4, atol=1e-5)
    assert out.loss_sum == pytest.approx(expected.sum(), rel=1e-4)
    np.testing.assert_allclose(out.outputs["values"], v, atol=1e-6)


def test_value_error_falls_and_policies_are_untouched(engine: TrainingEngine) -> None:
    engine.create_model("critic-train", CRITIC)
    engine.create_model("policy-beside", POLICY)
    batch = tokens_batch([8, 8, 8, 8], seed=3)
    probe = tokens_batch([6], seed=4, target_tokens=np.arange(3, 9))
    policy_before = engine.forward_backward("policy-beside", "cross_entropy", {}, probe, True).outputs["logprobs"]
    returns = parity_returns(batch)
    errors = []
    for _ in range(20):
        old = values_of(engine, "critic-train", batch)
        errors.append(float(((old - returns) ** 2).mean()))
        data = PackedBatch(batch.tokens, batch.offsets, {"values": old, "returns": returns})
        engine.forward_backward("critic-train", "ppo_critic", {"value_clip": 0.2}, data, forward_only=False)
        engine.optim_step("critic-train", AdamParams(learning_rate=3e-3))
    final = float(((values_of(engine, "critic-train", batch) - returns) ** 2).mean())
    assert errors[0] == pytest.approx(1.0)  # zero predictions against +-1 returns
    assert final < 0.1 * errors[0], errors
    policy_after = engine.forward_backward("policy-beside", "cross_entropy", {}, probe, True).outputs["logprobs"]
    np.testing.assert_array_equal(policy_after, policy_before)


def test_critic_gradients_shard_exactly(engine: TrainingEngine) -> None:
    """Each rank's gradient covers its datums; their sum (what optim_step all-reduces) is the single rank's."""
    ranks = [TrainingEngine(load_base_model(str(TINY_MODEL)), rank=r, world_size=2) for r in (0, 1)]
    batch = tokens_batch([3, 7, 2], seed=5)
    data = PackedBatch(
        batch.tokens, batch.offsets, {"values": np.full(12, 0.1, np.float32), "returns": parity_returns(batch)}
    )
    shards = []
    for e in (engine, *ranks):
        e.create_model("critic-sharded", CRITIC)
        shards.append(e.forward_backward("critic-sharded", "ppo_critic", {"value_clip": 0.2}, data, forward_only=False))
    merged = merge_shards(batch.offsets, shards[1:])
    terms = 2 * network_terms(TINY_MODEL)  # each rank's passes sum in their own order (tests/tolerances.py)
    assert_sums_close(merged.outputs["elementwise_loss"], shards[0].outputs["elementwise_loss"], terms)
    single, *per_rank = (e.loaded("critic-sharded").params for e in (engine, *ranks))
    head_grad = single[-2].grad  # the value head's weight: zero-initialised, so only it has a gradient yet
    assert head_grad is not None and head_grad.abs().max() > 0
    for whole, *parts in zip(single, *per_rank):
        if whole.grad is not None:
            assert_sums_close(sum(p.grad for p in parts), whole.grad, terms)
