"""Adapter files the sampler needs of its own: the all-zero adapter that stands for the base model."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoConfig


def write_zero_adapter(model_path: str, out_dir: Path) -> Path:
    """A rank-1 LoRA on layer 0's q_proj whose weights are all zero: outputs equal the base model's."""
    config = AutoConfig.from_pretrained(model_path)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    prefix = "base_model.model.model.layers.0.self_attn.q_proj"
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(
        {
            f"{prefix}.lora_A.weight": torch.zeros(1, config.hidden_size),
            f"{prefix}.lora_B.weight": torch.zeros(config.num_attention_heads * head_dim, 1),
        },
        str(out_dir / "adapter_model.safetensors"),
    )
    (out_dir / "adapter_config.json").write_text(
        json.dumps(
            {
                "peft_type": "LORA",
                "task_type": "CAUSAL_LM",
                "base_model_name_or_path": model_path,
                "r": 1,
                "lora_alpha": 1,
                "lora_dropout": 0.0,
                "bias": "none",
                "target_modules": ["q_proj"],
                "fan_in_fan_out": False,
                "modules_to_save": None,
                "use_rslora": False,
                "use_dora": False,
            }
        )
    )
    return out_dir
