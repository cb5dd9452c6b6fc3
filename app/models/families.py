"""The model families a base model may be: what LoRA adapts in each, and where each is trained and sampled.

Keyed by the `model_type` of the model's config.json. A base of a family missing here, or one its sampler cannot
serve, is refused when the app is built (deployments.builder), before anything is trained on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ATTN_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
# The sequence mixers that are not softmax attention count as attention layers (`train_attn`): Qwen3.5's Gated
# DeltaNet projections (vLLM stacks qkv+z and b+a), Nemotron-H's Mamba2 input projection (PEFT refuses its out_proj:
# Mamba kernels read that weight directly)
GATED_DELTANET_MODULES = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj")
MAMBA2_MODULES = ("in_proj",)
# DeepSeek-V3's multi-head latent attention: queries and keys/values through low-rank latents. Not kv_b_proj, which
# expands the latent into keys and values: vLLM's MLA folds its base weight into the queries and outputs when it loads
# the model and decodes with those, so a LoRA on it would be sampled without its delta
MLA_MODULES = ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "o_proj")
# Qwen3.5's and Qwen3-VL's checkpoints are vision-language models: on a base not served with images (no processor
# files: app.sampling.vision, whose options replace these otherwise) the Sampler serves their text only, building no
# vision tower and no image processor (Qwen3-VL without them failed vLLM's start: "Can't load image processor"); Qwen3.5
# with app.sampling.qwen3_5 and, in float32 on CPU, app.sampling.cpu_gdn
LANGUAGE_MODEL_ONLY = {"language_model_only": True}

# DeepSeek-V3 and GLM-4.5 mix dense MLP layers (the first few), routed experts and shared experts, all with projections
# named gate/up/down_proj. On these model types PEFT 0.21 (with transformers 5) turns every target ending in those
# names into its fused routed-expert LoRA and drops it as a module name, when training and again when an exported
# adapter is loaded: so `train_mlp` adapts the routed experts there, and the dense layers and shared experts stay
# frozen (docs/guides/model-families.md).


@dataclass(frozen=True)
class Family:
    """What LoRA adapts in a family (PEFT's `target_modules` and `target_parameters`) and where it is served.

    `mlp_modules` name dense MLP projections; on a MoE whose experts are fused 3-D parameters (transformers 5) PEFT
    maps the same names onto them (Qwen3-MoE). `expert_parameters` are fused expert parameters targeted by name
    (gpt-oss). The router is never adapted. `sampled_on_cpu`: vLLM's CPU build runs this family with LoRA enabled.
    `vllm_options` start the Sampler's engine; `lora_request` go with every adapter it loads."""

    name: str
    moe: bool = False
    attention_modules: tuple[str, ...] = ATTN_MODULES
    mlp_modules: tuple[str, ...] = MLP_MODULES
    expert_parameters: tuple[str, ...] = ()
    sampled_on_cpu: bool = True
    # how much larger than the LoRA rank a layer's rank can be in the adapter the sampler loads (PEFT stacks the
    # gate and up halves of Qwen3-MoE's fused experts into one rank-2r LoRA)
    sampler_rank_factor: int = 1
    trainer_attention: str = "sdpa"  # transformers' attn_implementation for the trainer's forward passes
    # app.training.sequence_parallel splits its long datums across ranks (its sequence mixers are sdpa attention and
    # Gated DeltaNet)
    sequence_parallel: bool = True
    # transformers builds the family's language model alone (AutoModelForCausalLM; for a vision-language checkpoint its
    # text part). False: it has no such class (Qwen3-VL, whose text layers take the vision tower's DeepStack features),
    # so the trainer builds the whole vision-language model and drops its vision tower (app.training.vision holds it);
    # its adapters then name the layers as the checkpoint does, which vLLM maps onto its own modules
    causal_lm: bool = True
    vllm_options: dict[str, Any] = field(default_factory=dict)
    lora_request: dict[str, Any] = field(default_factory=dict)

    def targets(self, train_attn: bool, train_mlp: bool) -> tuple[list[str], list[str]]:
        """PEFT's target_modules and target_parameters for an adapter of attention and/or MLP (or expert) layers."""
        modules = [*self.attention_modules] if train_attn else []
        modules += [*self.mlp_modules] if train_mlp else []
        return modules, [*self.expert_parameters] if train_mlp else []


def _moe(name: str, **shape: Any) -> Family:
    """A mixture of experts. vLLM serves its fused 3-D expert LoRA through the 2-D MoE LoRA wrapper only with the mixed
    format on. On CPU the experts run through app.sampling.cpu_moe_lora (vLLM's own MoE LoRA kernel is Triton's)."""
    return Family(
        name,
        moe=True,
        vllm_options={"enable_mixed_moe_lora_format": True, **shape.pop("vllm_options", {})},
        lora_request={"is_3d_lora_weight": True},
        **shape,
    )


FAMILIES: dict[str, Family] = {
    family.name: family
    for family in (
        Family("qwen2"),
        Family("qwen3"),
        Family("llama"),
        _moe("qwen3_moe", sampler_rank_factor=2),
        _moe(
            "gpt_oss",
            sampled_on_cpu=False,  # its experts' biases and clamped, interleaved SwiGLU: not in cpu_moe_lora
            mlp_modules=(),
            expert_parameters=("mlp.experts.gate_up_proj", "mlp.experts.down_proj"),
            trainer_attention="eager",  # transformers 5.19 has no SDPA path for its attention sinks
            sequence_parallel=False,  # (and its sliding-window layers)
        ),
        Family(
            "qwen3_5",
            attention_modules=ATTN_MODULES + GATED_DELTANET_MODULES,
            vllm_options=LANGUAGE_MODEL_ONLY,
        ),
        _moe(
            "qwen3_5_moe",
            attention_modules=ATTN_MODULES + GATED_DELTANET_MODULES,
            expert_parameters=("mlp.experts.gate_up_proj", "mlp.experts.down_proj"),  # MLP_MODULES: the shared expert
            vllm_options=LANGUAGE_MODEL_ONLY,
        ),
        _moe(
            "nemotron_h",
            attention_modules=ATTN_MODULES + MAMBA2_MODULES,
            mlp_modules=("up_proj", "down_proj"),  # squared-ReLU MLPs and shared experts: no gate
            expert_parameters=("mixer.experts.up_proj", "mixer.experts.down_proj"),
            sequence_parallel=False,  # its Mamba2 mixers' scan is not split across ranks
        ),
        Family("qwen3_vl", causal_lm=False, vllm_options=LANGUAGE_MODEL_ONLY),
        # the MLP names reach the routed experts only (above)
        _moe("deepseek_v3", attention_modules=MLA_MODULES, sampler_rank_factor=2),
        _moe("glm4_moe", sampler_rank_factor=2),
    )
}


# Other `model_type`s of a family: a vision-language family's language model (what AutoModelForCausalLM builds from
# its config), and Kimi K2, DeepSeek-V3's architecture under a name transformers has no class for (its config.json
# points at remote code; it is read with the family's class, as vLLM reads it: app.models.model_config)
ALIASES = {"qwen3_5_text": "qwen3_5", "qwen3_5_moe_text": "qwen3_5_moe", "kimi_k2": "deepseek_v3"}


class UnsupportedFamily(ValueError):
    """A base model of a family this server cannot train and sample."""


def family_of(model_type: str) -> Family:
    """The family of a config's `model_type`; UnsupportedFamily names the supported ones otherwise."""
    family = FAMILIES.get(ALIASES.get(model_type, model_type))
    if family is None:
        raise UnsupportedFamily(
            f"model_type {model_type!r} is not a supported model family; supported: {', '.join(sorted(FAMILIES))}"
        )
    return family


def model_class(family: Family) -> Any:
    """transformers' auto class that builds a base of this family as the trainer holds it (from a config or a
    checkpoint); the whole vision-language model's still has its vision tower (app.training.base_model drops it)."""
    import transformers

    return transformers.AutoModelForCausalLM if family.causal_lm else transformers.AutoModelForImageTextToText


def sampler_refusal(family: Family, on_gpu: bool) -> str | None:
    """Why a Sampler (on a GPU or not) cannot serve adapters of this family; None when it can."""
    if on_gpu or family.sampled_on_cpu:
        return None
    return (
        f"a {family.name} base cannot be sampled with LoRA on CPU: vLLM runs its experts with LoRA through Triton "
        "kernels only, which its CPU build lacks. Give its sampler a GPU (sampler.num_gpus: 1)"
    )
