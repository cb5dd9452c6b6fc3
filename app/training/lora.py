"""The PEFT pool that holds many LoRA adapters (app.messages.AdapterSpec) on one loaded base model."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from peft.tuners.lora.layer import Linear as LoraLinear
from peft.tuners.tuners_utils import BaseTunerLayer
from transformers import PreTrainedModel

from app.messages import AdapterSpec
from app.models.families import Family, family_of
from app.training.grouped_lora import segment_deltas

_PLACEHOLDER = "placeholder"  # keeps the PeftModel alive when no user adapter exists; never active


def peft_config(spec: AdapterSpec, family: Family) -> LoraConfig:
    """The adapter's PEFT config on a base of `family`: its attention and/or MLP (expert) layers."""
    modules, parameters = family.targets(spec.train_attn, spec.train_mlp)
    # peft annotates lora_alpha as int; it only scales by alpha / r, and our float alpha is saved as it is
    return LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,  # type: ignore[arg-type]
        lora_dropout=0.0,
        bias="none",
        target_modules=modules,
        target_parameters=parameters or None,
    )


class AdapterPool:
    """One frozen base model with any number of named LoRA adapters; one is active at a time. Adapters are float32
    whatever the base's dtype (PEFT upcasts them); PEFT casts each adapted layer's input to float32 too, unless
    `cast_inputs` is off (forward passes under bf16 autocast then run the adapters' matmuls in bf16)."""

    def __init__(self, base: torch.nn.Module, cast_inputs: bool = True) -> None:
        for p in base.parameters():
            p.requires_grad_(False)
        self._cast_inputs = cast_inputs
        if not isinstance(base, PreTrainedModel):
            raise TypeError(f"the base model must be a transformers model, got {type(base).__name__}")
        self.family = family_of(base.config.model_type)
        placeholder = LoraConfig(r=1, target_modules=[self.family.attention_modules[0]], lora_dropout=0.0)
        self.model: PeftModel = get_peft_model(base, placeholder, adapter_name=_PLACEHOLDER)

    def add(self, name: str, spec: AdapterSpec) -> list[torch.nn.Parameter]:
        """Add an adapter with a seeded, rank-identical initialisation; returns its trainable parameters."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(spec.seed)
            self.model.add_adapter(name, peft_config(spec, self.family))
        if not self._cast_inputs:  # layers the adapter wrapped just now included
            for module in self.model.modules():
                if isinstance(module, BaseTunerLayer):
                    setattr(module, "cast_input_dtype_enabled", False)  # noqa: B010 (mypy reads it as a submodule)
        return [p for n, p in self.model.named_parameters() if f".{name}." in n]

    def remove(self, name: str) -> None:
        self.model.set_adapter(_PLACEHOLDER)
        self.model.delete_adapter(name)

    def activate(self, name: str) -> None:
        if self.model.active_adapter != name:
            self.model.set_adapter(name)

    def can_mix(self) -> bool:
        """Whether `segments` can give rows their own adapters: not on a mixture of experts, whose expert adapters
        (`ParamWrapper`) it does not reach, and whose routing makes a row's experts' batch depend on other rows'
        values (a replayed pass, app.training.engine.TrainingEngine.replay, would not be bit for bit)."""
        return not self.family.moe

    @contextlib.contextmanager
    def segments(self, runs: list[tuple[str, int]]) -> Iterator[None]:
        """Within it, the model's forward gives each consecutive run of rows its own adapter: `runs` lists (adapter
        name, rows) in row order. Each adapted layer adds, per run, its adapter's LoRA product over that run's rows
        (app.training.grouped_lora: batched over the adapters of one rank), instead of PEFT's gather and scatter per
        row index and adapter. Every adapter is left untrainable inside (PEFT's disable_adapter) and
        on leaving (the active one trainable again): the caller says which learn, and runs their backward inside."""

        def add_deltas(module: LoraLinear, args: tuple[torch.Tensor, ...], output: torch.Tensor) -> torch.Tensor:
            return output + segment_deltas(module, runs, args[0], output.shape[-1]).to(output.dtype)

        hooks = [m.register_forward_hook(add_deltas) for m in self.model.modules() if isinstance(m, LoraLinear)]
        try:
            with self.model.disable_adapter():  # each layer computes its base alone; the hooks add the deltas
                yield
        finally:
            for hook in hooks:
                hook.remove()
