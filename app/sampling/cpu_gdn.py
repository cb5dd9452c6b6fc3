"""Gated DeltaNet (Qwen3.5's linear attention) on CPU where vLLM's kernels do not run (a vLLM general plugin, loaded
in the Sampler's processes).

vLLM 0.32 runs a Gated DeltaNet layer on CPU through `torch.ops.vllm.cpu_gdn_attention_core`, whose C++ kernels
(gating, chunked and recurrent delta rule) take BF16 only: it asserts "CPU GDN attention requires BF16", and only
heads of 64 or 128 dimensions ("Unexpected head dim size, 32": the tiny presets' heads). The Sampler runs in the
trainer's dtype (float32 on CPU) so that its logprobs are the trainer's. Here that op keeps vLLM's code for BF16
heads its kernels take and runs anything else in torch, in float32, with the math of transformers' torch path that
the trainer runs (its causal conv1d, gating, and chunked delta rule for prompts and the recurrent one for decoded
tokens), reading and writing vLLM's conv and SSM state caches in place. Speculative decoding (a wider conv state)
keeps vLLM's path.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F

logger = logging.getLogger("tinker_serve.sampler")
_VLLM_SERIES = "0.32."  # the op's contract and the state caches' layout are vLLM 0.32's
_CHUNK = 64  # transformers' torch_chunk_gated_delta_rule default, what the trainer runs
KERNEL_HEAD_DIMS = (64, 128)  # the key and value head sizes vLLM 0.32's BF16 CPU delta-rule kernels are built for


def runs_vllm_kernel(dtype: torch.dtype, head_k_dim: int, head_v_dim: int) -> bool:
    """Whether vLLM's own CPU kernels take this layer (BF16, heads they are built for); else the torch path runs it."""
    return dtype == torch.bfloat16 and head_k_dim in KERNEL_HEAD_DIMS and head_v_dim in KERNEL_HEAD_DIMS


def install() -> None:
    """Route vLLM's CPU Gated DeltaNet op to `gdn_core` where its kernels do not run (before the op is registered)."""
    import vllm
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    if not vllm.__version__.startswith(_VLLM_SERIES):
        logger.warning("vLLM %s: no float32 CPU Gated DeltaNet (this one is for %sx)", vllm.__version__, _VLLM_SERIES)
        return
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention
    from vllm.utils.torch_utils import LayerNameType

    original = gdn_attention.cpu_gdn_attention_core
    if getattr(original, "_tinker_serve", False):
        return

    def cpu_gdn_attention_core(
        mixed_qkv: torch.Tensor, b: torch.Tensor, a: torch.Tensor, core_attn_out: torch.Tensor, layer_name: Any
    ) -> None:
        from vllm.forward_context import get_forward_context
        from vllm.utils.torch_utils import _resolve_layer_name

        context = get_forward_context()
        layer = context.no_compile_layers[_resolve_layer_name(layer_name)]
        if runs_vllm_kernel(mixed_qkv.dtype, layer.head_k_dim, layer.head_v_dim):
            return original(mixed_qkv, b, a, core_attn_out, layer_name)
        metadata: Any = context.attn_metadata  # per layer: {prefix: GDNAttentionMetadata}, None when profiling
        if metadata is None or metadata[layer.prefix].num_actual_tokens == 0:
            return None
        gdn_core(layer, metadata[layer.prefix], mixed_qkv, b, a, core_attn_out)
        return None

    # vLLM registers it as a torch custom op, whose schema comes from these (resolved, not this module's strings)
    tensors = dict.fromkeys(("mixed_qkv", "b", "a", "core_attn_out"), torch.Tensor)
    cpu_gdn_attention_core.__annotations__ = tensors | {"layer_name": LayerNameType, "return": None}
    cpu_gdn_attention_core._tinker_serve = True  # type: ignore[attr-defined]
    gdn_attention.cpu_gdn_attention_core = cpu_gdn_attention_core


def gdn_core(
    layer: Any, metadata: Any, mixed_qkv: torch.Tensor, b: torch.Tensor, a: torch.Tensor, out: torch.Tensor
) -> None:
    """vLLM's CPU GDN core (decodes first, then prefills, as its metadata orders them) in torch, float32."""
    from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

    if metadata.spec_sequence_masks is not None or metadata.num_accepted_tokens is not None:
        raise NotImplementedError("speculative decoding with Gated DeltaNet in float32 on CPU")
    conv_cache, ssm_cache = layer.kv_cache[0], layer.kv_cache[1]
    conv_state = conv_cache if is_conv_state_dim_first() else conv_cache.transpose(-1, -2)  # [slots, dim, width - 1]
    slots, heads, v_dim, k_dim = ssm_cache.shape
    ssm_state = ssm_cache.view(slots, heads, k_dim, v_dim)
    weight = layer.conv1d.weight.reshape(layer.conv1d.weight.size(0), -1)  # [dim, width]
    bias = layer.conv1d.bias
    state_idx = metadata.non_spec_state_indices_tensor
    starts = metadata.non_spec_query_start_loc
    decodes, decode_tokens = metadata.num_decodes, metadata.num_decode_tokens

    if decodes > 0:  # one token each: batched
        rows = state_idx[:decodes].long()
        window = torch.cat([conv_state[rows], mixed_qkv[:decode_tokens, :, None].to(conv_state.dtype)], dim=-1)
        conv_state[rows] = window[..., 1:]
        x = _conv_out(window, weight, bias, layer.activation)
        query, key, value = layer.rearrange_mixed_qkv(x.to(mixed_qkv.dtype))  # [1, tokens, heads, dim]
        g, beta = _gating(layer, a[:decode_tokens], b[:decode_tokens])
        state = ssm_state[rows].float()
        o, state = _recurrent(layer, query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1), g, beta, state)
        ssm_state[rows] = state.to(ssm_state.dtype)
        out[:decode_tokens] = o.squeeze(1).to(out.dtype)

    for i in range(metadata.num_prefills):
        begin, end = int(starts[decodes + i]), int(starts[decodes + i + 1])
        slot = int(state_idx[decodes + i])
        fresh = not bool(metadata.has_initial_state[decodes + i])
        x = mixed_qkv[begin:end].T.to(conv_state.dtype)  # [dim, tokens]
        history = torch.zeros_like(conv_state[slot]) if fresh else conv_state[slot]
        window = torch.cat([history, x], dim=-1)
        conv_state[slot] = window[:, -history.size(-1) :]
        x = F.conv1d(window[None], weight[:, None, :], bias, groups=weight.size(0))[0]  # [dim, tokens]
        x = F.silu(x) if layer.activation in ("silu", "swish") else x
        query, key, value = layer.rearrange_mixed_qkv(x.T.contiguous().to(mixed_qkv.dtype))
        g, beta = _gating(layer, a[begin:end], b[begin:end])
        state = None if fresh else ssm_state[slot][None].float()
        o, state = _chunked(layer, query, key, value, g[None], beta[None], state)
        ssm_state[slot] = state[0].to(ssm_state.dtype)
        out[begin:end] = o[0].to(out.dtype)


def _conv_out(window: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str) -> torch.Tensor:
    """The causal conv1d's output for the last position of each window ([tokens, dim, width])."""
    x = (window * weight).sum(-1)
    x = x + bias if bias is not None else x
    return F.silu(x) if activation in ("silu", "swish") else x


def _gating(layer: Any, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The log decay g and the write strength beta per token and value head, as transformers computes them."""
    g = -layer.A_log.float().exp() * F.softplus(a.float() + layer.dt_bias.float())
    return g, b.float().sigmoid()


def _heads(layer: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> list[torch.Tensor]:
    """Query and key repeated onto the value heads, l2-normalized, query scaled; [batch, heads, tokens, dim]."""
    repeat = value.size(2) // query.size(2)
    query, key = (x.float().repeat_interleave(repeat, dim=2) for x in (query, key))
    query, key = (x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6) for x in (query, key))
    query = query * query.size(-1) ** -0.5
    return [x.transpose(1, 2).contiguous() for x in (query, key, value.float())]


def _recurrent(
    layer: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of the gated delta rule per batch row ([rows, 1, heads, dim]; g and beta [rows, heads]); the output
    [rows, 1, heads, v_dim] and the new state [rows, heads, k_dim, v_dim]."""
    query, key, value = (x[:, :, 0] for x in _heads(layer, query, key, value))  # [rows, heads, dim]
    state = state * g.exp()[..., None, None]
    delta = (value - (state * key[..., None]).sum(-2)) * beta[..., None]
    state = state + key[..., None] * delta[..., None, :]
    return (state * query[..., None]).sum(-2)[:, None], state


def _chunked(
    layer: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' torch_chunk_gated_delta_rule (chunks of 64): [1, tokens, heads, dim] in, the output
    [1, tokens, heads, v_dim] and the final state [1, heads, k_dim, v_dim] out."""
    query, key, value = _heads(layer, query, key, value)
    beta, g = beta.transpose(1, 2).contiguous(), g.transpose(1, 2).contiguous()
    batch, heads, tokens, k_dim = key.shape
    v_dim = value.size(-1)
    pad = (_CHUNK - tokens % _CHUNK) % _CHUNK
    query, key, value = (F.pad(x, (0, 0, 0, pad)) for x in (query, key, value))
    beta, g = (F.pad(x, (0, pad)) for x in (beta, g))
    v_beta, k_beta = value * beta[..., None], key * beta[..., None]
    query, key, k_beta, v_beta = (x.reshape(batch, heads, -1, _CHUNK, x.size(-1)) for x in (query, key, k_beta, v_beta))
    decay = g.reshape(batch, heads, -1, _CHUNK).cumsum(-1)
    upper = torch.ones(_CHUNK, _CHUNK, dtype=torch.bool).triu(1)
    pairwise = (decay[..., :, None] - decay[..., None, :]).masked_fill(upper, float("-inf")).exp()
    system = (k_beta @ key.transpose(-1, -2)) * pairwise
    intra = (query @ key.transpose(-1, -2)) * pairwise
    new_values = torch.linalg.solve_triangular(system, v_beta, upper=False, unitriangular=True)
    k_cumdecay = torch.linalg.solve_triangular(system, k_beta * decay.exp()[..., None], upper=False, unitriangular=True)
    state = torch.zeros(batch, heads, k_dim, v_dim) if state is None else state
    query = query * decay.exp()[..., None]
    key = key * (decay[..., -1:] - decay).exp()[..., None]
    chunk_decay = decay[..., -1].exp()[..., None, None]
    out = torch.zeros_like(new_values)
    for i in range(new_values.size(2)):
        v_new = new_values[:, :, i] - k_cumdecay[:, :, i] @ state
        out[:, :, i] = query[:, :, i] @ state + intra[:, :, i] @ v_new
        state = state * chunk_decay[:, :, i] + key[:, :, i].transpose(-1, -2) @ v_new
    out = out.reshape(batch, heads, -1, v_dim)[:, :, :tokens]
    return out.transpose(1, 2), state
