"""LoRA adapter specs and the PEFT pool that holds many adapters on one loaded base model."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from peft import LoraConfig, PeftModel, get_peft_model

ATTN_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
_PLACEHOLDER = "placeholder"  # keeps the PeftModel alive when no user adapter exists; never active


@dataclass(frozen=True)
class AdapterSpec:
    """A model's trainable parts: a LoRA adapter on the shared base, plus a value head for a critic."""

    rank: int
    seed: int
    train_attn: bool = True
    train_mlp: bool = True
    alpha: float = 32.0
    role: str = "policy"  # "critic": the model also has a scalar value head and predicts values

    def target_modules(self) -> list[str]:
        """The adapted projections. The unembedding (lm_head) is never adapted: vLLM samplers refuse
        lm_head LoRAs, and sampler logprobs must equal the trainer's."""
        modules = [*ATTN_MODULES] if self.train_attn else []
        modules += [*MLP_MODULES] if self.train_mlp else []
        return modules

    def peft_config(self) -> LoraConfig:
        return LoraConfig(r=self.rank, lora_alpha=self.alpha, lora_dropout=0.0, bias="none",
                          target_modules=self.target_modules())


class AdapterPool:
    """One frozen base model with any number of named LoRA adapters; one is active at a time."""

    def __init__(self, base: torch.nn.Module) -> None:
        for p in base.parameters():
            p.requires_grad_(False)
        placeholder = LoraConfig(r=1, target_modules=["q_proj"], lora_dropout=0.0)
        self.model: PeftModel = get_peft_model(base, placeholder, adapter_name=_PLACEHOLDER)

    def add(self, name: str, spec: AdapterSpec) -> list[torch.nn.Parameter]:
        """Add an adapter with a seeded, rank-identical initialisation; returns its trainable parameters."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(spec.seed)
            self.model.add_adapter(name, spec.peft_config())
        return [p for n, p in self.model.named_parameters() if f".{name}." in n]

    def remove(self, name: str) -> None:
        self.model.set_adapter(_PLACEHOLDER)
        self.model.delete_adapter(name)

    def activate(self, name: str) -> None:
        if self.model.active_adapter != name:
            self.model.set_adapter(name)
