"""Training checkpoints in the engine: save_state -> load_state reproduces outputs and, with the optimizer,
the next step exactly; critics keep their value head; mismatched specs and missing checkpoints are refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from app.errors import NotFound, UserError
from app.messages import AdamParams, AdapterSpec
from app.training.base_model import load_base_model
from app.training.engine import TrainingEngine
from app.training_data.batch import PackedBatch
from tests.conftest import TINY_MODEL

POLICY = AdapterSpec(rank=4, seed=5)
CRITIC = AdapterSpec(rank=4, seed=5, role="critic")


@pytest.fixture(scope="module")
def engine() -> TrainingEngine:
    return TrainingEngine(load_base_model(str(TINY_MODEL)))


def batch(critic: bool) -> PackedBatch:
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, 2048, 12, dtype=np.int64)
    offsets = np.array([0, 5, 12], dtype=np.int64)
    if critic:
        return PackedBatch(
            tokens, offsets, {"values": np.zeros(12, np.float32), "returns": rng.uniform(-1, 1, 12).astype(np.float32)}
        )
    return PackedBatch(
        tokens,
        offsets,
        {"target_tokens": rng.integers(3, 2048, 12, dtype=np.int64), "weights": np.ones(12, np.float32)},
    )


def step(engine: TrainingEngine, model_id: str, critic: bool) -> np.ndarray:
    """One training step; returns the outputs of a forward after it."""
    loss = ("ppo_critic", {"value_clip": 0.2}) if critic else ("cross_entropy", {})
    engine.forward_backward(model_id, *loss, batch(critic), forward_only=False)
    engine.optim_step(model_id, AdamParams(learning_rate=1e-2))
    out = engine.forward_backward(model_id, *loss, batch(critic), forward_only=True).outputs
    return out["values" if critic else "logprobs"]


@pytest.mark.parametrize("spec", [POLICY, CRITIC], ids=["policy", "critic"])
def test_round_trip_with_and_without_optimizer(engine: TrainingEngine, spec: AdapterSpec, tmp_path: Path) -> None:
    critic = spec.role == "critic"
    prefix = spec.role
    engine.create_model(f"{prefix}-src", spec)
    for _ in range(3):
        trained = step(engine, f"{prefix}-src", critic)
    engine.save_state(f"{prefix}-src", tmp_path / "c1")
    files = sorted(p.name for p in (tmp_path / "c1").iterdir())
    expected = ["adapter_config.json", "adapter_model.safetensors", "optimizer.pt", "tinker_model.json"]
    assert files == sorted(expected + (["value_head.safetensors"] if critic else []))

    engine.create_model(f"{prefix}-full", AdapterSpec(**{**spec.__dict__, "seed": 99}))
    engine.create_model(f"{prefix}-weights", AdapterSpec(**{**spec.__dict__, "seed": 98}))
    engine.load_state(f"{prefix}-full", tmp_path / "c1", with_optimizer=True)
    engine.load_state(f"{prefix}-weights", tmp_path / "c1", with_optimizer=False)
    source, full, weights_only = (
        engine.adapter_state(m) for m in (f"{prefix}-src", f"{prefix}-full", f"{prefix}-weights")
    )
    # exact here and below: a load restores the saved bytes, and the same step on the same bytes is the same arithmetic
    assert [torch.equal(a, b) for a, b in zip(source.values(), full.values())] == [True] * len(source)
    assert [torch.equal(a, b) for a, b in zip(source.values(), weights_only.values())] == [True] * len(source)

    after_src, after_full, after_weights = (
        step(engine, m, critic) for m in (f"{prefix}-src", f"{prefix}-full", f"{prefix}-weights")
    )
    np.testing.assert_array_equal(after_full, after_src)  # Adam moments restored: the same step
    assert not np.array_equal(after_weights, after_src)  # a fresh optimizer takes a different step
    assert not np.array_equal(after_src, trained)


def test_mismatched_and_missing_checkpoints(engine: TrainingEngine, tmp_path: Path) -> None:
    engine.create_model("mm-policy", POLICY)
    engine.save_state("mm-policy", tmp_path / "p")
    for model_id, spec in (("mm-critic", CRITIC), ("mm-rank", AdapterSpec(rank=8, seed=5))):
        engine.create_model(model_id, spec)
        with pytest.raises(UserError) as info:
            engine.load_state(model_id, tmp_path / "p", with_optimizer=True)
        assert info.value.field == "path"
    engine.save_adapter("mm-policy", tmp_path / "sampler")  # sampler weights are not a training checkpoint
    with pytest.raises(NotFound):
        engine.load_state("mm-policy", tmp_path / "sampler", with_optimizer=False)


def test_a_checkpoint_saved_before_adamw_was_fused_restores_fused_and_steps_the_same(
    engine: TrainingEngine, tmp_path: Path
) -> None:
    engine.create_model("foreach-src", POLICY)
    step(engine, "foreach-src", critic=False)
    engine.save_state("foreach-src", tmp_path / "old")
    saved = torch.load(tmp_path / "old" / "optimizer.pt", weights_only=True)
    for group in saved["param_groups"]:  # as AdamW(foreach=True) wrote it
        group.update(fused=None, foreach=True)
    torch.save(saved, tmp_path / "old" / "optimizer.pt")

    engine.create_model("foreach-restored", AdapterSpec(**{**POLICY.__dict__, "seed": 97}))
    engine.load_state("foreach-restored", tmp_path / "old", with_optimizer=True)
    restored = engine._models["foreach-restored"].optimizer
    assert [(g["fused"], g["foreach"]) for g in restored.param_groups] == [(True, None)]
    # exact: both step with the fused AdamW from the same restored moments, the same arithmetic
    np.testing.assert_array_equal(step(engine, "foreach-restored", False), step(engine, "foreach-src", False))


def test_a_checkpoint_without_optimizer_state_loads_with_its_optimizer_fresh(
    engine: TrainingEngine, tmp_path: Path
) -> None:
    """An uploaded adapter (app.api.uploads) holds no optimizer.pt: load_state_with_optimizer starts Adam fresh."""
    engine.create_model("up-src", POLICY)
    step(engine, "up-src", critic=False)
    engine.save_state("up-src", tmp_path / "u")
    (tmp_path / "u" / "optimizer.pt").unlink()
    engine.create_model("up-full", AdapterSpec(rank=4, seed=97))
    engine.create_model("up-weights", AdapterSpec(rank=4, seed=96))
    engine.load_state("up-full", tmp_path / "u", with_optimizer=True)
    engine.load_state("up-weights", tmp_path / "u", with_optimizer=False)
    # exact: the same bytes and a fresh optimizer each, so the same arithmetic
    np.testing.assert_array_equal(step(engine, "up-full", critic=False), step(engine, "up-weights", critic=False))
