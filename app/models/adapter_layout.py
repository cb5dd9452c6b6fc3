"""The tensors of a PEFT LoRA adapter on a base model, from the base's config.json (no torch): the names and shapes
`save_pretrained` writes to adapter_model.safetensors, for the dense families whose layers this knows."""

from __future__ import annotations

from typing import Any

from app.models.families import ALIASES, ATTN_MODULES, MLP_MODULES

# the families whose decoder layers are `model.layers.{i}.self_attn.{q,k,v,o}_proj` and `.mlp.{gate,up,down}_proj`
DENSE_FAMILIES = ("llama", "qwen2", "qwen3")
_PREFIX = "base_model.model.model.layers"


def lora_tensors(config: dict[str, Any], rank: int, train_attn: bool, train_mlp: bool) -> dict[str, tuple[int, int]]:
    """Every tensor name of the adapter and its shape (lora_A: rank x in, lora_B: out x rank); ValueError naming the
    supported families for a base of another."""
    model_type = ALIASES.get(config.get("model_type", ""), config.get("model_type", ""))
    if model_type not in DENSE_FAMILIES:
        raise ValueError(f"adapters of {model_type!r} bases cannot be uploaded; supported: {', '.join(DENSE_FAMILIES)}")
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or hidden // heads)
    kv = int(config.get("num_key_value_heads") or heads) * head_dim
    inner = int(config["intermediate_size"])
    shapes = {  # (in, out) of each linear layer
        "q_proj": (hidden, heads * head_dim),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "o_proj": (heads * head_dim, hidden),
        "gate_proj": (hidden, inner),
        "up_proj": (hidden, inner),
        "down_proj": (inner, hidden),
    }
    modules = [("self_attn", m) for m in ATTN_MODULES if train_attn] + [("mlp", m) for m in MLP_MODULES if train_mlp]
    tensors: dict[str, tuple[int, int]] = {}
    for layer in range(int(config["num_hidden_layers"])):
        for parent, module in modules:
            fan_in, fan_out = shapes[module]
            name = f"{_PREFIX}.{layer}.{parent}.{module}"
            tensors[f"{name}.lora_A.weight"] = (rank, fan_in)
            tensors[f"{name}.lora_B.weight"] = (fan_out, rank)
    return tensors
