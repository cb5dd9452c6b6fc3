"""Adapter files the sampler needs of its own: the all-zero adapter that stands for the base model."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from app.models.families import family_of, model_class
from app.models.model_config import transformers_config


def write_zero_adapter(model_path: str, out_dir: Path) -> Path:
    """A rank-1 LoRA on the first attention projection the family adapts (q_proj on most) whose weights are all zero:
    outputs equal the base model's. Its name and shape come from the model as the trainer builds it (on the meta
    device: no weights are read), so it names modules as the trainer's adapters do."""
    config = transformers_config(model_path)
    family = family_of(config.model_type)
    target = family.attention_modules[0]
    with torch.device("meta"):
        model = model_class(family).from_config(config)
    name, module = next((n, m) for n, m in model.named_modules() if n.endswith(f".{target}"))
    out_features, in_features = module.weight.shape
    prefix = f"base_model.model.{name}"
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(
        {
            f"{prefix}.lora_A.weight": torch.zeros(1, in_features),
            f"{prefix}.lora_B.weight": torch.zeros(out_features, 1),
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
                "target_modules": [target],
                "fan_in_fan_out": False,
                "modules_to_save": None,
                "use_rslora": False,
                "use_dora": False,
            }
        )
    )
    return out_dir
