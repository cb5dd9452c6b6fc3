"""LoRA on a mixture of experts in vLLM's CPU build: the experts' forward with each token's adapter, in torch.

vLLM 0.32 serves a MoE's LoRA through `TritonExperts`, whose expert GEMMs and LoRA kernels are Triton's; its CPU build
has no Triton, so every forward of a LoRA-enabled MoE failed on CPU (Qwen3-MoE: `triton.language` has no `float32`).
`experts_forward` is the same computation, expert by expert and adapter by adapter: for each expert, the rows routed
to it get `gate_up = x @ w13.T` plus each adapter's `(x @ A.T) @ B.T` on its gate and up halves, SiLU-and-mul, then
`x @ w2.T` plus the adapter's down-projection delta, weighted by the router and summed into the token's output. vLLM
folds each adapter's scaling into its B matrices when it loads it, so none is applied here.

vLLM loads `install` in each of its processes as a general plugin (pyproject's `vllm.general_plugins` entry point); on
a GPU it leaves vLLM's kernels alone.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:  # vLLM's: only its processes load this module
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.experts.triton_moe import TritonExperts
    from vllm.model_executor.layers.fused_moe.modular_kernel import ExpertTokensMetadata

logger = logging.getLogger("tinker_serve.sampler")
_VLLM_SERIES = "0.32."  # TritonExperts.apply's signature and the LoRA context's layout are vLLM 0.32's


def experts_forward(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    token_adapters: torch.Tensor | None,
    lora: tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...], torch.Tensor, torch.Tensor] | None,
    weight_on_input: bool = False,
) -> torch.Tensor:
    """The gated-SiLU experts' output [tokens, hidden] for `x` [tokens, hidden] routed to `topk_ids` [tokens, k].
    `w13` [experts, 2 x inter, hidden] stacks each expert's gate and up projections, `w2` [experts, hidden, inter].
    `token_adapters` [tokens]: each token's adapter slot (-1: none). `lora`: the slots' stacked weights, as vLLM's
    MoE LoRA layer holds them: the gate and up A [slots, experts, rank, hidden] and B [slots, experts, inter, rank],
    then the down projection's A [slots, experts, rank, inter] and B [slots, experts, hidden, rank]."""
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float32, device=x.device)
    inter = w2.shape[2]
    for expert in torch.unique(topk_ids).tolist():
        rows, slots = (topk_ids == expert).nonzero(as_tuple=True)
        xe = x[rows]
        gate_up = xe @ w13[expert].T
        adapters = token_adapters[rows] if token_adapters is not None and lora is not None else None
        used = [] if adapters is None else [a for a in torch.unique(adapters).tolist() if a >= 0]
        masks = {adapter: adapters == adapter for adapter in used} if adapters is not None else {}
        for adapter, mine in masks.items():
            assert lora is not None
            for half, (a, b) in enumerate(zip(lora[0], lora[1], strict=True)):
                delta = (xe[mine] @ a[adapter, expert].T.to(xe.dtype)) @ b[adapter, expert].T.to(xe.dtype)
                gate_up[mine, half * inter : (half + 1) * inter] += delta
        hidden = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        ye = hidden @ w2[expert].T
        for adapter, mine in masks.items():
            assert lora is not None
            a, b = lora[2][adapter, expert], lora[3][adapter, expert]
            ye[mine] += (hidden[mine] @ a.T.to(hidden.dtype)) @ b.T.to(hidden.dtype)
        weights = 1.0 if weight_on_input else topk_weights[rows, slots].unsqueeze(1)
        out.index_add_(0, rows, (ye * weights).float())
    return out.to(x.dtype)


def _apply(
    self: TritonExperts,
    output: torch.Tensor,
    hidden_states: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: MoEActivation,
    global_num_experts: int,
    expert_map: torch.Tensor | None,
    a1q_scale: torch.Tensor | None,
    a2_scale: torch.Tensor | None,
    workspace13: torch.Tensor,
    workspace2: torch.Tensor,
    expert_tokens_meta: ExpertTokensMetadata | None,
    apply_router_weight_on_input: bool,
) -> None:
    """TritonExperts.apply's contract on CPU: the experts' routed, weighted sum into `output` [tokens, hidden]."""
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation

    if activation != MoEActivation.SILU or expert_map is not None or self.w1_bias is not None:
        raise NotImplementedError(
            f"vLLM's CPU build runs MoE LoRA for gated-SiLU experts without biases or expert parallelism only "
            f"(this model: {activation}, biases: {self.w1_bias is not None}, expert map: {expert_map is not None})"
        )
    context = self._lora_context
    lora, adapters = None, None
    if context is not None:
        lora = (context.w13_lora_a_stacked, context.w13_lora_b_stacked,
                context.w2_lora_a_stacked[0], context.w2_lora_b_stacked[0])  # fmt: skip
        mapping = context.local_token_lora_mapping
        adapters = (mapping if mapping is not None else context.punica_wrapper.token_lora_indices)[: output.shape[0]]
    output.copy_(
        experts_forward(hidden_states, w1, w2, topk_weights, topk_ids, adapters, lora, apply_router_weight_on_input)
    )


def install() -> None:
    """On CPU, run vLLM's LoRA-enabled MoE experts (`TritonExperts`) with `experts_forward` (vLLM 0.32 only)."""
    import vllm
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    if not vllm.__version__.startswith(_VLLM_SERIES):
        logger.warning("vLLM %s: no CPU MoE LoRA (this one is for %sx)", vllm.__version__, _VLLM_SERIES)
        return
    from vllm.model_executor.layers.fused_moe.experts.triton_moe import TritonExperts

    TritonExperts.apply = _apply  # type: ignore[method-assign]
