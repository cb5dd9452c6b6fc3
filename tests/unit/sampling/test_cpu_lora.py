"""The per-adapter CPU LoRA ops give what vLLM's own torch ops give, and vLLM's engine process loads them."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest
import torch
from vllm.lora.ops import torch_ops as vllm_ops

from app.sampling import cpu_lora

SLOTS, RANK, HIDDEN, OUT, TOKENS = 4, 8, 64, 96, 12
INDEX_SETS = {
    "one adapter": [2] * TOKENS,
    "mixed, with -1 (vLLM: the last slot)": [0, 1, -1, 3, 1, 0] * 2,
    "all -1": [-1] * TOKENS,
}


@pytest.fixture
def weights() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    lora_a = torch.randn(SLOTS, 1, RANK, HIDDEN, generator=gen)
    lora_b = torch.randn(SLOTS, 1, OUT, RANK, generator=gen)
    return lora_a, lora_b


def assert_same(op: str, out: torch.Tensor, inputs: torch.Tensor, lora: torch.Tensor, *args: object) -> torch.Tensor:
    """Runs vLLM's op and ours, each on its own copy of `out`; asserts they agree and returns vLLM's result."""
    theirs, ours = out.clone(), out.clone()
    getattr(vllm_ops, op)(inputs, lora, theirs, *args)
    cpu_lora.OPS[op](inputs, lora, ours, *args)
    torch.testing.assert_close(ours, theirs)
    return theirs


@pytest.mark.parametrize("indices", INDEX_SETS.values(), ids=INDEX_SETS.keys())
def test_decode_ops_match_vllm(weights: tuple[torch.Tensor, torch.Tensor], indices: list[int]) -> None:
    lora_a, lora_b = weights
    index = torch.tensor(indices)
    x = torch.randn(TOKENS, HIDDEN)
    shrunk = assert_same("bgmv_shrink", torch.zeros(TOKENS, RANK), x, lora_a, index, 0.5)
    for add_inputs in (True, False):
        padded = torch.randn(TOKENS, OUT + 5)  # the model's output padded past the adapter's
        assert_same("bgmv_expand", padded, shrunk, lora_b, index, add_inputs)
        assert_same("bgmv_expand_slice", torch.randn(TOKENS, 2 * OUT), shrunk, lora_b, index, OUT, OUT, add_inputs)


def test_prefill_ops_match_vllm(weights: tuple[torch.Tensor, torch.Tensor]) -> None:
    lora_a, lora_b = weights
    seq_lens = torch.tensor([5, 4, 3])
    seq_adapters = torch.tensor([1, 3, 1])
    starts = torch.tensor([0, 5, 9])
    meta = (starts, seq_lens, seq_adapters, 3, 5, TOKENS)
    x = torch.randn(TOKENS, HIDDEN)
    shrunk = assert_same("sgmv_shrink", torch.zeros(TOKENS, RANK), x, lora_a, *meta, 2.0)
    assert_same("sgmv_expand", torch.randn(TOKENS, OUT), shrunk, lora_b, *meta, True)
    assert_same("sgmv_expand_slice", torch.randn(TOKENS, 3 * OUT), shrunk, lora_b, *meta, OUT, OUT, False)


def test_a_single_row_is_added_to_every_output_row(weights: tuple[torch.Tensor, torch.Tensor]) -> None:
    _, lora_b = weights
    assert_same("bgmv_expand", torch.randn(3, OUT), torch.randn(1, RANK), lora_b, torch.tensor([2]), True)


def test_vllm_loads_install_as_a_general_plugin() -> None:
    plugins = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert plugins.get("cpu_lora_ops") == "app.sampling.cpu_lora:install"
    from vllm.lora.punica_wrapper import punica_cpu

    originals = {name: getattr(punica_cpu, name) for name in cpu_lora.OPS}
    try:
        cpu_lora.install()
        assert all(getattr(punica_cpu, name) is op for name, op in cpu_lora.OPS.items())
    finally:
        for name, op in originals.items():
            setattr(punica_cpu, name, op)
