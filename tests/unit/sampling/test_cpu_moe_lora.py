"""The CPU experts-with-LoRA forward equals the MoE computed token by token, adapters mixed in one batch, and vLLM's
engine process runs its LoRA-enabled MoE experts with it (the Sampler's side of Qwen3-MoE on CPU: the adapter's
logprobs against the trainer's are tests/integration/test_families.py)."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest
import torch
import torch.nn.functional as F
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


def _token_by_token(m: dict[str, torch.Tensor], adapters: list[int]) -> torch.Tensor:
    out = torch.zeros(TOKENS, HIDDEN)
    for t in range(TOKENS):
        x, slot = m["x"][t], adapters[t]
        for k in range(TOP_K):
            e = int(m["topk_ids"][t, k])
            gate, up = (m["w13"][e] @ x).split(INTER)
            if slot >= 0:
                gate = gate + m["gate_b"][slot, e] @ (m["gate_a"][slot, e] @ x)
                up = up + m["up_b"][slot, e] @ (m["up_a"][slot, e] @ x)
            h = F.silu(gate) * up
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


def test_vllm_loads_install_as_a_general_plugin() -> None:
    plugins = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert plugins.get("cpu_moe_lora") == "app.sampling.cpu_moe_lora:install"
    original = TritonExperts.apply
    try:
        cpu_moe_lora.install()
        assert TritonExperts.apply is cpu_moe_lora._apply
    finally:
        TritonExperts.apply = original  # type: ignore[method-assign]
