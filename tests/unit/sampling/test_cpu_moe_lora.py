"""The CPU experts-with-LoRA forward equals the MoE computed token by token, adapters mixed in one batch, gated-SiLU
(Qwen3-MoE) and squared-ReLU (Nemotron-H) experts, and vLLM's engine process runs its LoRA-enabled MoE experts with it
(the Sampler's side of Qwen3-MoE on CPU: the adapter's logprobs against the trainer's are
tests/integration/test_families.py); vLLM's 3-D to 2-D adapter conversion keeps a non-gated up projection whole."""

from __future__ import annotations

from importlib.metadata import entry_points
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from vllm.lora.model_manager import LoRAModelManager
from vllm.model_executor.layers.fused_moe.config import FusedMoEConfig
from vllm.model_executor.layers.fused_moe.experts.triton_moe import TritonExperts

from app.sampling import cpu_moe_lora

EXPERTS, TOP_K, HIDDEN, INTER, RANK, SLOTS, TOKENS = 6, 2, 32, 24, 4, 3, 10


@pytest.fixture
def moe() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * 0.3

    weights = torch.rand(TOKENS, TOP_K, generator=gen)
    return {
        "x": rand(TOKENS, HIDDEN),
        "w13": rand(EXPERTS, 2 * INTER, HIDDEN),
        "w2": rand(EXPERTS, HIDDEN, INTER),
        "topk_ids": torch.stack([torch.randperm(EXPERTS, generator=gen)[:TOP_K] for _ in range(TOKENS)]),
        "topk_weights": weights / weights.sum(1, keepdim=True),
        "gate_a": rand(SLOTS, EXPERTS, RANK, HIDDEN),
        "up_a": rand(SLOTS, EXPERTS, RANK, HIDDEN),
        "gate_b": rand(SLOTS, EXPERTS, INTER, RANK),
        "up_b": rand(SLOTS, EXPERTS, INTER, RANK),
        "down_a": rand(SLOTS, EXPERTS, RANK, INTER),
        "down_b": rand(SLOTS, EXPERTS, HIDDEN, RANK),
    }


def _token_by_token(m: dict[str, torch.Tensor], adapters: list[int], gated: bool = True) -> torch.Tensor:
    out = torch.zeros(TOKENS, HIDDEN)
    for t in range(TOKENS):
        x, slot = m["x"][t], adapters[t]
        for k in range(TOP_K):
            e = int(m["topk_ids"][t, k])
            gate, up = (m["w13"][e] @ x).split(INTER)
            if slot >= 0:
                gate = gate + m["gate_b"][slot, e] @ (m["gate_a"][slot, e] @ x)
                up = up + m["up_b"][slot, e] @ (m["up_a"][slot, e] @ x)
            h = F.silu(gate) * up if gated else F.relu(up) ** 2
            y = m["w2"][e] @ h
            if slot >= 0:
                y = y + m["down_b"][slot, e] @ (m["down_a"][slot, e] @ h)
            out[t] += m["topk_weights"][t, k] * y
    return out


@pytest.mark.parametrize("adapters", [[-1] * TOKENS, [1] * TOKENS, [0, 2, -1, 1, 0, 2, 2, -1, 1, 0]])
def test_experts_forward_equals_the_moe_token_by_token(moe: dict[str, torch.Tensor], adapters: list[int]) -> None:
    lora = ((moe["gate_a"], moe["up_a"]), (moe["gate_b"], moe["up_b"]), moe["down_a"], moe["down_b"])
    ours = cpu_moe_lora.experts_forward(
        moe["x"], moe["w13"], moe["w2"], moe["topk_weights"], moe["topk_ids"], torch.tensor(adapters), lora
    )
    torch.testing.assert_close(ours, _token_by_token(moe, adapters), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("adapters", [[-1] * TOKENS, [0, 2, -1, 1, 0, 2, 2, -1, 1, 0]])
def test_squared_relu_experts_equal_the_moe_token_by_token(moe: dict[str, torch.Tensor], adapters: list[int]) -> None:
    """Nemotron-H's non-gated experts: w13 is the up projection alone, one LoRA slice on it."""
    lora = ((moe["up_a"],), (moe["up_b"],), moe["down_a"], moe["down_b"])
    ours = cpu_moe_lora.experts_forward(
        moe["x"], moe["w13"][:, INTER:], moe["w2"], moe["topk_weights"], moe["topk_ids"], torch.tensor(adapters), lora,
        activation="relu2_no_mul",
    )  # fmt: skip
    torch.testing.assert_close(ours, _token_by_token(moe, adapters, gated=False), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("non_gated", [True, False])
def test_3d_to_2d_conversion_sees_a_non_gated_up_projection_twice(non_gated: bool) -> None:
    """vLLM splits the fused w13 LoRA's B in halves (gate, up) and a non-gated layer keeps the first: both halves
    must be the whole up projection's B there, and a gated one's B is left as it is."""
    up_b, seen = torch.randn(6, 4), {}
    loras = {"m.experts.base_layer": SimpleNamespace(lora_b=up_b)}
    manager = SimpleNamespace(_is_non_gated_moe=non_gated, _get_lora_layer_weights=lambda model, name: loras.get(name))

    def convert(self: object, lora_model: object, module: object, module_name: str) -> None:
        seen["b"] = loras[module_name + ".base_layer"].lora_b

    cpu_moe_lora._non_gated_3d_to_2d(convert)(manager, None, None, "m.experts")
    torch.testing.assert_close(seen["b"], torch.cat([up_b, up_b]) if non_gated else up_b)


def test_vllm_loads_install_as_a_general_plugin() -> None:
    plugins = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert plugins.get("cpu_moe_lora") == "app.sampling.cpu_moe_lora:install"
    originals = TritonExperts.apply, FusedMoEConfig.__post_init__, LoRAModelManager._convert_3d_to_2d_moe_lora
    try:
        cpu_moe_lora.install()
        cpu_moe_lora.install()  # each vLLM process loads it once; twice wraps nothing twice
        assert TritonExperts.apply is cpu_moe_lora._apply
        assert FusedMoEConfig.__post_init__.__closure__[0].cell_contents is originals[1]  # type: ignore[attr-defined]
        assert LoRAModelManager._convert_3d_to_2d_moe_lora.__closure__[0].cell_contents is originals[2]  # type: ignore[attr-defined]
    finally:
        TritonExperts.apply, FusedMoEConfig.__post_init__, LoRAModelManager._convert_3d_to_2d_moe_lora = originals  # type: ignore[method-assign]
