"""LoRA on a mixture of experts in vLLM's CPU build: the experts' forward with each token's adapter, in torch.

vLLM 0.32 serves a MoE's LoRA through `TritonExperts`, whose expert GEMMs and LoRA kernels are Triton's; its CPU build
has no Triton, so every forward of a LoRA-enabled MoE failed on CPU (Qwen3-MoE: `triton.language` has no `float32`).
`experts_forward` is the same computation, expert by expert and adapter by adapter: for each expert, the rows routed
to it get `w13 = x @ w13.T` plus each adapter's `(x @ A.T) @ B.T` on each of its slices (gate and up for gated-SiLU
experts, up alone for Nemotron-H's squared-ReLU ones), the activation, then `x @ w2.T` plus the adapter's
down-projection delta, weighted by the router and summed into the token's output. vLLM folds each adapter's scaling
into its B matrices when it loads it, so none is applied here.

vLLM's MoE config refuses non-gated experts (`is_act_and_mul=False`) on CPU outright, for its CPU expert kernel's sake;
with LoRA enabled that kernel is never used (the experts are `TritonExperts`, run here), so `install` lets such a
config through when LoRA is on, and only then.

vLLM 0.32 turns a 3-D (PEFT target_parameters) expert adapter into its 2-D per-expert layout
(`LoRAModelManager._convert_3d_to_2d_moe_lora`) by splitting the fused w13 LoRA's B output in two halves, gate and up,
also for non-gated experts, whose w13 is the up projection alone: Nemotron-H's experts kept the first half of their up
projection's LoRA and lost the second. `install` hands that converter the up projection's B twice over, so both
halves are the whole of it and the non-gated layer keeps its first. That is vLLM's loader, the same on a GPU, so it is
corrected on every platform.

vLLM loads `install` in each of its processes as a general plugin (pyproject's `vllm.general_plugins` entry point); on
a GPU it leaves vLLM's kernels alone.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

if TYPE_CHECKING:  # vLLM's: only its processes load this module
    from collections.abc import Callable

    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.model_manager import LoRAModelManager
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.config import FusedMoEConfig
    from vllm.model_executor.layers.fused_moe.experts.triton_moe import TritonExperts
    from vllm.model_executor.layers.fused_moe.modular_kernel import ExpertTokensMetadata

logger = logging.getLogger("tinker_serve.sampler")
_VLLM_SERIES = "0.32."  # TritonExperts.apply's signature and the LoRA context's layout are vLLM 0.32's


_ACTIVATIONS = {
    "silu": lambda gate_up, inter: F.silu(gate_up[:, :inter]) * gate_up[:, inter:],
    "relu2_no_mul": lambda up, inter: F.relu(up).square(),
}


def experts_forward(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    token_adapters: torch.Tensor | None,
    lora: tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...], torch.Tensor, torch.Tensor] | None,
    weight_on_input: bool = False,
    activation: str = "silu",
) -> torch.Tensor:
    """The experts' output [tokens, hidden] for `x` [tokens, hidden] routed to `topk_ids` [tokens, k].
    `activation` (a vLLM MoEActivation's value): "silu", gated: `w13` [experts, 2 x inter, hidden] stacks each expert's
    gate and up projections; "relu2_no_mul", Nemotron-H's squared ReLU: `w13` [experts, inter, hidden] is the up
    projection alone. `w2` [experts, hidden, inter]. `token_adapters` [tokens]: each token's adapter slot (-1: none).
    `lora`: the slots' stacked weights, as vLLM's MoE LoRA layer holds them: A [slots, experts, rank, hidden] and B
    [slots, experts, inter, rank] of each w13 slice (gate and up, or up alone), then the down projection's A [slots,
    experts, rank, inter] and B [slots, experts, hidden, rank]."""
    if activation not in _ACTIVATIONS:
        raise NotImplementedError(f"no CPU MoE LoRA for {activation} experts (only {', '.join(_ACTIVATIONS)})")
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float32, device=x.device)
    inter = w2.shape[2]
    for expert in torch.unique(topk_ids).tolist():
        rows, slots = (topk_ids == expert).nonzero(as_tuple=True)
        xe = x[rows]
        w13_out = xe @ w13[expert].T
        adapters = token_adapters[rows] if token_adapters is not None and lora is not None else None
        used = [] if adapters is None else [a for a in torch.unique(adapters).tolist() if a >= 0]
        masks = {adapter: adapters == adapter for adapter in used} if adapters is not None else {}
        for adapter, mine in masks.items():
            assert lora is not None
            for half, (a, b) in enumerate(zip(lora[0], lora[1], strict=True)):
                delta = (xe[mine] @ a[adapter, expert].T.to(xe.dtype)) @ b[adapter, expert].T.to(xe.dtype)
                w13_out[mine, half * inter : (half + 1) * inter] += delta
        hidden = _ACTIVATIONS[activation](w13_out, inter)
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
    if activation.value not in _ACTIVATIONS or expert_map is not None or self.w1_bias is not None:
        raise NotImplementedError(
            f"vLLM's CPU build runs MoE LoRA for gated-SiLU or squared-ReLU experts without biases or expert "
            f"parallelism only (this model: {activation}, biases: {self.w1_bias is not None}, "
            f"expert map: {expert_map is not None})"
        )
    context = self._lora_context
    lora, adapters = None, None
    if context is not None:
        lora = (context.w13_lora_a_stacked, context.w13_lora_b_stacked,
                context.w2_lora_a_stacked[0], context.w2_lora_b_stacked[0])  # fmt: skip
        mapping = context.local_token_lora_mapping
        adapters = (mapping if mapping is not None else context.punica_wrapper.token_lora_indices)[: output.shape[0]]
    output.copy_(
        experts_forward(
            hidden_states,
            w1,
            w2,
            topk_weights,
            topk_ids,
            adapters,
            lora,
            apply_router_weight_on_input,
            activation.value,
        )
    )


_NON_GATED_ON_CPU = "is_act_and_mul=False is supported only for CUDA, XPU and ROCm for now"


def _allow_non_gated_lora_experts(post_init: Callable[[FusedMoEConfig], None]) -> Callable[[FusedMoEConfig], None]:
    """FusedMoEConfig.__post_init__ that lets non-gated experts through on CPU when LoRA is enabled (their forward is
    `_apply`'s then). vLLM 0.32 raises that refusal as the method's last statement, after every field is set."""

    def __post_init__(self: FusedMoEConfig) -> None:
        try:
            post_init(self)
        except NotImplementedError as refusal:
            if not (self.is_lora_enabled and str(refusal) == _NON_GATED_ON_CPU):
                raise

    return __post_init__


def _non_gated_3d_to_2d(convert: Callable[..., None]) -> Callable[..., None]:
    """LoRAModelManager._convert_3d_to_2d_moe_lora that keeps a non-gated w13's whole up-projection LoRA."""

    def _convert_3d_to_2d_moe_lora(
        self: LoRAModelManager, lora_model: LoRAModel, module: Any, module_name: str
    ) -> None:
        up = self._get_lora_layer_weights(lora_model, module_name + ".base_layer")
        if self._is_non_gated_moe and up is not None and up.lora_b is not None:
            up.lora_b = torch.cat([up.lora_b, up.lora_b])  # the halves vLLM splits off as "gate" and "up": both whole
        convert(self, lora_model, module, module_name)

    return _convert_3d_to_2d_moe_lora


def install() -> None:
    """On CPU, run vLLM's LoRA-enabled MoE experts (`TritonExperts`) with `experts_forward` (vLLM 0.32 only), and
    let a LoRA-enabled MoE config have non-gated experts."""
    import vllm
    from vllm.platforms import current_platform

    if not vllm.__version__.startswith(_VLLM_SERIES):
        logger.warning("vLLM %s: no MoE LoRA corrections (these are for %sx)", vllm.__version__, _VLLM_SERIES)
        return
    from vllm.lora.model_manager import LoRAModelManager

    convert = LoRAModelManager._convert_3d_to_2d_moe_lora
    if not getattr(convert, "_tinker_serve", False):
        LoRAModelManager._convert_3d_to_2d_moe_lora = _non_gated_3d_to_2d(convert)  # type: ignore[method-assign]
        LoRAModelManager._convert_3d_to_2d_moe_lora._tinker_serve = True  # type: ignore[attr-defined]
    if not current_platform.is_cpu():
        return
    from vllm.model_executor.layers.fused_moe.config import FusedMoEConfig
    from vllm.model_executor.layers.fused_moe.experts.triton_moe import TritonExperts

    TritonExperts.apply = _apply  # type: ignore[method-assign]
    if not getattr(FusedMoEConfig.__post_init__, "_tinker_serve", False):
        FusedMoEConfig.__post_init__ = _allow_non_gated_lora_experts(FusedMoEConfig.__post_init__)  # type: ignore[method-assign]
        FusedMoEConfig.__post_init__._tinker_serve = True  # type: ignore[attr-defined]
