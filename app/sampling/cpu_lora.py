"""vLLM's CPU LoRA ops, one matrix product per adapter in the batch instead of a per-token weight gather.

vLLM 0.32's `PunicaWrapperCPU` applies every LoRA layer with plain torch ops that first copy each token's adapter
matrix (`weights[indices]`: tokens x rank x hidden floats) and then contract it per token with `einsum`. On the peer
workload that was 38-41% of an engine step (README, "The engine's profile"). A batch holds few adapters, so the
same product is one `x @ W.T` per adapter over that adapter's rows. The contract is vLLM's, index for index: an
index of -1 selects the last slot, as vLLM's gather does, and the output slices and `add_inputs` are the same.

vLLM loads `install` in each of its processes as a general plugin (pyproject's `vllm.general_plugins` entry point);
a Sampler `env` of `VLLM_PLUGINS=""` keeps vLLM's own ops.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

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


def bgmv_shrink(
    inputs: torch.Tensor,
    lora_a_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    scaling: float = 1.0,
) -> None:
    """`output[:, :rank] = scaling * inputs @ A[index].T`, per token."""
    out = per_adapter_matmul(inputs, lora_a_weights, lora_indices_tensor, output_tensor.dtype)
    output_tensor[:, : out.shape[1]] = scaling * out


def bgmv_expand(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    add_inputs: bool = True,
) -> None:
    """`output[:, :n] (+)= inputs @ B[index].T` on the columns both have; a single row goes to every row."""
    out = per_adapter_matmul(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    cols = min(out.shape[1], output_tensor.shape[1])  # adapter and model may pad their outputs differently
    if add_inputs:
        output_tensor[:, :cols] += out[: output_tensor.shape[0], :cols]
    else:
        output_tensor[:, :cols] = out[: output_tensor.shape[0], :cols]


def bgmv_expand_slice(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    slice_offset: int,
    slice_size: int,
    add_inputs: bool = True,
) -> None:
    """`output[:, offset:offset + size] (+)= inputs @ B[index].T`, per token."""
    out = per_adapter_matmul(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if add_inputs:
        output_tensor[:, slice_offset : slice_offset + slice_size] += out
    else:
        output_tensor[:, slice_offset : slice_offset + slice_size] = out


def _token_indices(lora_indices_tensor: torch.Tensor, seq_len_tensor: torch.Tensor) -> torch.Tensor:
    """Each sequence's adapter index repeated for each of its tokens."""
    return torch.repeat_interleave(lora_indices_tensor, seq_len_tensor)


def sgmv_shrink(
    inputs: torch.Tensor,
    lora_a_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    b_seq_start_loc: torch.Tensor,
    seq_len_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    batches: int,
    max_seq_length: int,
    token_nums: int,
    scaling: float,
) -> None:
    """`bgmv_shrink` over prefill sequences (one adapter index per sequence)."""
    indices = _token_indices(lora_indices_tensor, seq_len_tensor)
    bgmv_shrink(inputs, lora_a_weights, output_tensor, indices, scaling)


def sgmv_expand(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    b_seq_start_loc: torch.Tensor,
    seq_len_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    batches: int,
    max_seq_length: int,
    token_nums: int,
    add_inputs: bool = False,
) -> None:
    """`bgmv_expand` over prefill sequences."""
    indices = _token_indices(lora_indices_tensor, seq_len_tensor)
    bgmv_expand(inputs, lora_b_weights, output_tensor, indices, add_inputs)


def sgmv_expand_slice(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    b_seq_start_loc: torch.Tensor,
    seq_len_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    batches: int,
    max_seq_length: int,
    token_nums: int,
    slice_offset: int,
    slice_size: int,
    add_inputs: bool = False,
) -> None:
    """`bgmv_expand_slice` over prefill sequences."""
    indices = _token_indices(lora_indices_tensor, seq_len_tensor)
    bgmv_expand_slice(inputs, lora_b_weights, output_tensor, indices, slice_offset, slice_size, add_inputs)


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
