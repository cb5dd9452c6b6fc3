"""Every supported model family (app.models.families) in the trainer, on its tiny random-weight preset built offline:
MLP-only LoRA (expert LoRA on the mixtures of experts) learns, the exported adapter loads in PEFT and gives the same
logprobs, a critic learns, a bfloat16 base learns and stays close to float32, a model rebuilt from its snapshot and
replayed steps (a recovery) equals the undisturbed one bit for bit, and a base sharded across two ranks trains exactly
as a replicated one. The sampler's side is tests/integration/test_family_samplers.py and test_families.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from peft import PeftModel

from app.config import ServerConfig
from app.messages import AdamParams, AdapterSpec
from app.models.embedded import build_embedded_model
from app.models.families import FAMILIES, UnsupportedFamily, family_of, model_class, sampler_refusal
from app.training.base_model import load_base_model
from app.training.checkpoint import write_captured
from app.training.engine import TrainingEngine
from app.training_data.batch import PackedBatch
from deployments.builder import served_base_models
from tests.conftest import TINY_MODEL
from tests.tolerances import assert_sums_close, network_terms
from tests.unit.training.sharded_ranks import batch_of, engine_on, run_ranks

PRESETS = {
    "qwen3": "tiny-qwen3",
    "llama": "tiny-llama",
    "qwen3_moe": "tiny-qwen3-moe",
    "gpt_oss": "tiny-gpt-oss",
    "qwen3_5": "tiny-qwen3_5",
    "qwen3_5_moe": "tiny-qwen3_5-moe",
    "nemotron_h": "tiny-nemotron-h",
    "deepseek_v3": "tiny-deepseek-v3",
    "glm4_moe": "tiny-glm4-moe",
    "qwen3_vl": "tiny-qwen3-vl",
}
MLP_ONLY = AdapterSpec(rank=8, seed=3, train_attn=False)
ADAM = AdamParams(learning_rate=1e-2)
LENGTHS = [12, 9, 7, 10]
# float32 sharded vs replicated: the same arithmetic, but MKL may sum in another order for weights gathered elsewhere
# in memory; tests/tolerances.py's bound for a gradient's chain of sums (every tiny preset has the tiny Qwen2's widths)
SHARDED_TERMS = 2 * network_terms(TINY_MODEL)
PEFT_ATOL = 1e-4  # our engine's blockwise logprobs vs PEFT's full logits, float32
# bf16 vs float32 logprobs of the same tokens: 0.010-0.017 median measured. Not the largest: where rounding changes a
# token's top-2 experts it moves by nats (gpt-oss: 1.24 on one of 38 tokens; the dense families and Qwen3-MoE 0.036)
BF16_MEDIAN_ATOL = 0.05


@pytest.fixture(scope="module")
def models(presets_dir: Path) -> dict[str, Path]:
    built = {family: build_embedded_model(preset, presets_dir / preset) for family, preset in PRESETS.items()}
    return {"qwen2": TINY_MODEL, **built}


def test_every_family_has_a_tiny_preset_tested_here() -> None:
    assert set(FAMILIES) == {"qwen2", *PRESETS}


def test_an_unknown_family_is_named_with_the_supported_ones() -> None:
    with pytest.raises(UnsupportedFamily, match=r"'mamba'.*deepseek_v3, glm4_moe, gpt_oss, llama, nemotron_h, qwen2"):
        family_of("mamba")


def test_only_gpt_oss_needs_a_gpu_sampler() -> None:
    for name, family in FAMILIES.items():
        assert sampler_refusal(family, on_gpu=True) is None
        refusal = sampler_refusal(family, on_gpu=False)
        assert (refusal is not None) == (name == "gpt_oss"), name
        assert refusal is None or "sampler.num_gpus" in refusal


def _served(path: Path, num_gpus: float) -> ServerConfig:
    base = {"name": "org/moe", "path": str(path), "sampler": {"num_gpus": num_gpus}}
    return ServerConfig.model_validate({"auth": {"mode": "any_tml_key_on_loopback"}, "base_models": [base]})


def test_a_base_its_sampler_cannot_serve_is_refused_before_anything_starts(models: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match=r"base_models\[0\] \(org/moe\): a gpt_oss base .*sampler\.num_gpus: 1"):
        served_base_models(_served(models["gpt_oss"], num_gpus=0))
    assert served_base_models(_served(models["gpt_oss"], num_gpus=1))[1]["org/moe"]["arch"] == "gpt_oss"
    assert served_base_models(_served(models["qwen3_moe"], num_gpus=0))[1]["org/moe"]["arch"] == "qwen3_moe"


def _losses(engine: TrainingEngine, model_id: str, loss: str, batch: PackedBatch, steps: int) -> list[float]:
    losses = []
    for _ in range(steps):
        losses.append(engine.forward_backward(model_id, loss, {}, batch, forward_only=False).loss_sum)
        engine.optim_step(model_id, ADAM)
    return losses


def _logprobs(engine: TrainingEngine, model_id: str, batch: PackedBatch) -> np.ndarray:
    return engine.forward_backward(model_id, "cross_entropy", {}, batch, forward_only=True).outputs["logprobs"]


@pytest.mark.parametrize("family", ["qwen2", *PRESETS])
def test_mlp_only_lora_learns_and_its_export_loads_in_peft(
    family: str, models: dict[str, Path], tmp_path: Path
) -> None:
    path = models[family]
    engine = TrainingEngine(load_base_model(str(path)))
    engine.create_model("m", MLP_ONLY)
    adapted = list(engine.adapter_state("m"))
    assert adapted and not any(f".{m}." in n for n in adapted for m in FAMILIES[family].attention_modules)
    assert any(".experts." in n for n in adapted) == FAMILIES[family].moe  # a MoE's MLP LoRA reaches its experts
    batch = batch_of(LENGTHS, seed=1)
    losses = _losses(engine, "m", "cross_entropy", batch, steps=6)
    assert losses[-1] < 0.7 * losses[0], losses

    engine.save_adapter("m", tmp_path / "adapter")
    base = model_class(FAMILIES[family]).from_pretrained(path, attn_implementation=FAMILIES[family].trainer_attention)
    peft = PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    ours = _logprobs(engine, "m", batch)
    theirs = []
    with torch.no_grad():
        for start, end in zip(batch.offsets[:-1], batch.offsets[1:], strict=True):
            logits = peft(torch.from_numpy(batch.tokens[start:end])[None]).logits[0].float()
            targets = torch.from_numpy(batch.loss_inputs["target_tokens"][start:end])
            theirs.append(torch.log_softmax(logits, -1).gather(1, targets[:, None])[:, 0].numpy())
    np.testing.assert_allclose(ours, np.concatenate(theirs), atol=PEFT_ATOL)


@pytest.mark.parametrize("family", PRESETS)
def test_a_critic_learns(family: str, models: dict[str, Path]) -> None:
    engine = TrainingEngine(load_base_model(str(models[family])))
    engine.create_model("c", AdapterSpec(rank=8, seed=4, train_attn=False, role="critic"))
    plain = batch_of(LENGTHS, seed=2)
    returns = np.where(plain.tokens % 2 == 0, 1.0, -1.0).astype(np.float32)
    batch = PackedBatch(plain.tokens, plain.offsets, {"values": np.zeros_like(returns), "returns": returns})
    errors = []
    for _ in range(8):
        out = engine.forward_backward("c", "ppo_critic", {"value_clip": 100.0}, batch, forward_only=False)
        errors.append(float(np.mean((out.outputs["values"] - returns) ** 2)))
        engine.optim_step("c", AdamParams(learning_rate=2e-3))
    assert errors[-1] < 0.3 * errors[0], errors  # 0.07-0.09 of it measured


@pytest.mark.parametrize("family", PRESETS)
def test_a_bfloat16_base_learns_close_to_float32(family: str, models: dict[str, Path]) -> None:
    batch = batch_of(LENGTHS, seed=3)
    engines = {
        dtype: TrainingEngine(load_base_model(str(models[family]), dtype)) for dtype in (torch.float32, torch.bfloat16)
    }
    for engine in engines.values():
        engine.create_model("m", MLP_ONLY)
    first = {dtype: _logprobs(engine, "m", batch) for dtype, engine in engines.items()}
    assert np.median(np.abs(first[torch.bfloat16] - first[torch.float32])) <= BF16_MEDIAN_ATOL
    losses = _losses(engines[torch.bfloat16], "m", "cross_entropy", batch, steps=6)
    assert losses[-1] < 0.7 * losses[0], losses


@pytest.mark.parametrize("family", PRESETS)
def test_a_model_rebuilt_from_its_snapshot_equals_the_undisturbed_one(
    family: str, models: dict[str, Path], tmp_path: Path
) -> None:
    """What a recovery does on fresh workers: the model's snapshot (with its optimizer state), then the steps after
    it replayed; the weights and logprobs equal the undisturbed model's bit for bit (no arithmetic differs)."""
    batch, spec = batch_of(LENGTHS, seed=5), AdapterSpec(rank=8, seed=6)  # attention and MLP (experts) adapted
    undisturbed = TrainingEngine(load_base_model(str(models[family])))
    undisturbed.create_model("m", spec)
    _losses(undisturbed, "m", "cross_entropy", batch, steps=2)
    write_captured(undisturbed.capture_state("m"), tmp_path / "snapshot")
    _losses(undisturbed, "m", "cross_entropy", batch, steps=2)
    rebuilt = TrainingEngine(load_base_model(str(models[family])))
    rebuilt.create_model("m", spec)
    rebuilt.load_state("m", tmp_path / "snapshot", with_optimizer=True)
    _losses(rebuilt, "m", "cross_entropy", batch, steps=2)
    for name, weight in undisturbed.adapter_state("m").items():
        assert torch.equal(rebuilt.adapter_state("m")[name], weight), name
    np.testing.assert_array_equal(_logprobs(rebuilt, "m", batch), _logprobs(undisturbed, "m", batch))


def _train_every_family(rank: int, world: int, *, sharding: str, models: dict[str, str]) -> dict[str, Any]:
    """On each rank: every family's base, 3 MLP-only steps over 4 datums (2 passes of at most 24 tokens a rank),
    then this rank's logprobs and the adapter's weights."""
    batch = batch_of(LENGTHS, seed=4)
    out = {}
    for family, path in models.items():
        engine = engine_on(Path(path), rank, world, sharding=sharding, micro_batch_tokens=24)
        engine.create_model("m", MLP_ONLY)
        _losses(engine, "m", "cross_entropy", batch, steps=3)
        adapter = {name: weight.numpy() for name, weight in engine.adapter_state("m").items()}  # tensors would travel
        out[family] = {"logprobs": _logprobs(engine, "m", batch), "adapter": adapter}  # as handles to a dead process
    return out


def test_a_sharded_base_trains_as_a_replicated_one(models: dict[str, Path]) -> None:
    paths = {family: str(models[family]) for family in PRESETS}
    fsdp, replicated = (run_ranks(_train_every_family, 2, sharding=s, models=paths) for s in ("fsdp", "replicate"))
    for family in PRESETS:
        for rank in (0, 1):
            ours, theirs = fsdp[rank][family], replicated[rank][family]
            assert_sums_close(ours["logprobs"], theirs["logprobs"], SHARDED_TERMS, err_msg=family)
            for name, weight in ours["adapter"].items():
                assert_sums_close(weight, theirs["adapter"][name], SHARDED_TERMS, err_msg=name)
