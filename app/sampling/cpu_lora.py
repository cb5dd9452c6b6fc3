"""vLLM's CPU LoRA ops, one matrix product per adapter in the batch instead of a per-token weight gather.

vLLM 0.32's `PunicaWrapperCPU` applies every LoRA layer with plain torch ops that first copy each token's adapter
matrix (`weights[indices]`: tokens x rank x hidden floats) and then contract it per token with `einsum`. On the peer
workload that was 38-41% of an engine step (bench/results/history.md, "Against the peer"). A batch holds few
adapters, so the same product is one `x @ W.T` per adapter over that adapter's rows. The contract is vLLM's, index for
index: an index of -1 selects the last slot, as vLLM's gather does, and the output slices and `add_inputs` are the
same. Every argument is required: vLLM 0.32's callers pass them all, and its own defaults differ between the two
forms.

vLLM loads `install` in each of its processes as a general plugin (pyproject's `vllm.general_plugins` entry point);
a Sampler `env` of `VLLM_PLUGINS=""` keeps vLLM's own ops.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

logger = logging.getLogger("tinker_serve.sampler")
_VLLM_SERIES = "0.32."  # the ops' signatures are vLLM 0.32's (vllm/lora/ops/torch_ops)


def per_adapter_matmul(
    inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """Row i of the result is `inputs[i] @ weights[indices[i]].T`, computed once per distinct index."""
    if weights.dim() == 4:  # vLLM stacks adapters as [slots, 1, out, in]
        weights = weights.squeeze(1)
    x = inputs.to(dtype)
    adapters = torch.unique(indices)
    if adapters.numel() == 1:
        return x @ weights[int(adapters)].to(dtype).T
    out = x.new_empty((indices.shape[0], weights.shape[1]))
    for adapter in adapters.tolist():
        rows = indices == adapter
        out[rows] = x[rows] @ weights[adapter].to(dtype).T
    return out


def _store(target: torch.Tensor, values: torch.Tensor, add: bool) -> None:
    """Add `values` to the view `target` of an op's output, or overwrite it (broadcasting a single row)."""
    if add:
        target.add_(values)
    else:
        target.copy_(values)


def bgmv_shrink(
    inputs: torch.Tensor,
    lora_a_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    scaling: float,
) -> None:
    """`output[:, :rank] = scaling * inputs @ A[index].T`, per token."""
    out = per_adapter_matmul(inputs, lora_a_weights, lora_indices_tensor, output_tensor.dtype)
    output_tensor[:, : out.shape[1]] = scaling * out


def bgmv_expand(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    add_inputs: bool,
) -> None:
    """`output[:, :n] (+)= inputs @ B[index].T` on the columns both have; a single row goes to every row."""
    out = per_adapter_matmul(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    cols = min(out.shape[1], output_tensor.shape[1])  # adapter and model may pad their outputs differently
    _store(output_tensor[:, :cols], out[: output_tensor.shape[0], :cols], add_inputs)


def bgmv_expand_slice(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    slice_offset: int,
    slice_size: int,
    add_inputs: bool,
) -> None:
    """`output[:, offset:offset + size] (+)= inputs @ B[index].T`, per token."""
    out = per_adapter_matmul(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    _store(output_tensor[:, slice_offset : slice_offset + slice_size], out, add_inputs)


def _per_sequence(op: Callable[..., None]) -> Callable[..., None]:
    """The prefill (`sgmv_*`) form of a decode op: vLLM passes one adapter index per sequence, in its prefill
    metadata (starts, lengths, indices, batches, longest, tokens), between the output and the op's own arguments."""

    def prefill(
        inputs: torch.Tensor,
        lora_weights: torch.Tensor,
        output_tensor: torch.Tensor,
        b_seq_start_loc: torch.Tensor,
        seq_len_tensor: torch.Tensor,
        lora_indices_tensor: torch.Tensor,
        batches: int,
        max_seq_length: int,
        token_nums: int,
        *op_args: Any,
    ) -> None:
        op(inputs, lora_weights, output_tensor, torch.repeat_interleave(lora_indices_tensor, seq_len_tensor), *op_args)

    prefill.__name__ = prefill.__qualname__ = "s" + op.__name__[1:]
    return prefill


sgmv_shrink = _per_sequence(bgmv_shrink)
sgmv_expand = _per_sequence(bgmv_expand)
sgmv_expand_slice = _per_sequence(bgmv_expand_slice)


OPS: dict[str, Callable[..., None]] = {
    op.__name__: op for op in (bgmv_shrink, bgmv_expand, bgmv_expand_slice, sgmv_shrink, sgmv_expand, sgmv_expand_slice)
}


def install() -> None:
    """Point vLLM's `PunicaWrapperCPU` at these ops (vLLM 0.32 only; other versions keep their own)."""
    import vllm
    from vllm.lora.punica_wrapper import punica_cpu

    if not vllm.__version__.startswith(_VLLM_SERIES):
        logger.warning("vLLM %s: keeping its own CPU LoRA ops (these are for %sx)", vllm.__version__, _VLLM_SERIES)
        return
    for name, op in OPS.items():
        setattr(punica_cpu, name, op)
