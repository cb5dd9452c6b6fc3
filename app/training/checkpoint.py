"""Training checkpoint files: a PEFT adapter directory plus what resumes training.

A checkpoint directory (built locally, then stored by app.storage.objects) holds `adapter_config.json` +
`adapter_model.safetensors` (a PEFT adapter, so samplers and HF tools read it as is),
`value_head.safetensors` for critics, `optimizer.pt` (the AdamW state) and `tinker_model.json` (the
model's AdapterSpec: rank, targets, role).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel, get_peft_model_state_dict, set_peft_model_state_dict
from safetensors.torch import load_file, save_file

from app.errors import NotFound, UserError
from app.messages import AdapterSpec

SPEC_FILE = "tinker_model.json"
VALUE_HEAD_FILE = "value_head.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
ADAPTER_FILE = "adapter_model.safetensors"


def write_adapter(model: PeftModel, adapter: str, out: Path) -> None:
    """The adapter alone, as a PEFT adapter directory at `out`."""
    model.save_pretrained(str(out.parent / f"{out.name}.peft"), selected_adapters=[adapter])
    os.rename(out.parent / f"{out.name}.peft" / adapter, out)  # PEFT nests non-default adapters


def write_state(
    model: PeftModel,
    adapter: str,
    spec: AdapterSpec,
    value_head: torch.nn.Module | None,
    optimizer: torch.optim.Optimizer,
    out: Path,
) -> None:
    """Everything that resumes training: adapter, value head, optimizer state and spec."""
    write_adapter(model, adapter, out)
    _write_resume_parts(None if value_head is None else value_head.state_dict(), optimizer.state_dict(), spec, out)


@dataclass(frozen=True)
class TrainingState:
    """A copy of a model's training state on the CPU, detached from the live tensors (a snapshot being written
    while training goes on). Written by `write_captured`, it reads back with `load_state`."""

    adapter: dict[str, torch.Tensor]  # PEFT's keys, as adapter_model.safetensors holds them
    value_head: dict[str, torch.Tensor] | None
    optimizer: dict[str, Any]
    spec: AdapterSpec


def capture_state(
    model: PeftModel,
    adapter: str,
    spec: AdapterSpec,
    value_head: torch.nn.Module | None,
    optimizer: torch.optim.Optimizer,
) -> TrainingState:
    """Copy the model's training state (the only part of a snapshot that holds up training)."""
    return TrainingState(
        adapter=_copied(get_peft_model_state_dict(model, adapter_name=adapter)),
        value_head=None if value_head is None else _copied(value_head.state_dict()),
        optimizer=_copied(optimizer.state_dict()),
        spec=spec,
    )


def write_captured(state: TrainingState, out: Path) -> None:
    """Write a captured state as a training checkpoint directory at `out` (without the adapter's PEFT config:
    only load_state reads it back)."""
    out.mkdir(parents=True)
    save_file(state.adapter, str(out / ADAPTER_FILE))
    _write_resume_parts(state.value_head, state.optimizer, state.spec, out)


def _write_resume_parts(
    value_head: dict[str, torch.Tensor] | None, optimizer: dict[str, Any], spec: AdapterSpec, out: Path
) -> None:
    if value_head is not None:
        save_file({k: v.detach().cpu().contiguous() for k, v in value_head.items()}, str(out / VALUE_HEAD_FILE))
    torch.save(optimizer, out / OPTIMIZER_FILE)
    (out / SPEC_FILE).write_text(json.dumps(asdict(spec), sort_keys=True))


def _copied(value: Any) -> Any:
    """`value` with every tensor in it copied to the CPU (dicts and lists walked)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _copied(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_copied(v) for v in value)
    return value


def read_spec(directory: str | Path) -> AdapterSpec:
    """The spec a training checkpoint was saved with; NotFound when `directory` holds none."""
    try:
        raw = json.loads((Path(directory) / SPEC_FILE).read_text())
    except (OSError, ValueError):
        raise NotFound(
            "no training checkpoint there (never saved, deleted, or a sampler-weights path)", field="path"
        ) from None
    return AdapterSpec(**raw)


def load_state(
    model: PeftModel,
    adapter: str,
    value_head: torch.nn.Module | None,
    optimizer: torch.optim.Optimizer | None,
    directory: str | Path,
    device: torch.device,
) -> None:
    """Load a checkpoint into an existing adapter of the same spec (and its optimizer, when given)."""
    directory = Path(directory)
    weights = load_file(str(directory / ADAPTER_FILE), device=str(device))
    result = set_peft_model_state_dict(model, weights, adapter_name=adapter)
    # peft annotates the result as `namedtuple` (the factory); it is torch's load_state_dict result
    unexpected_keys = result.unexpected_keys  # type: ignore[attr-defined]
    if unexpected_keys:
        raise UserError(f"the checkpoint does not fit this model: unexpected {unexpected_keys[:3]}", field="path")
    if value_head is not None:
        value_head.load_state_dict(load_file(str(directory / VALUE_HEAD_FILE), device=str(device)))
    if optimizer is not None and (directory / OPTIMIZER_FILE).exists():  # an uploaded adapter has none: kept fresh
        _load_optimizer_state(optimizer, torch.load(directory / OPTIMIZER_FILE, map_location=device, weights_only=True))


_IMPLEMENTATION_FLAGS = ("fused", "foreach")


def _load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load saved optimizer state, keeping how this optimizer runs: a state dict carries its implementation flags
    (a checkpoint from before AdamW was fused says foreach), and those are this server's choice, not the state's."""
    flags = [{k: group[k] for k in _IMPLEMENTATION_FLAGS if k in group} for group in optimizer.param_groups]
    optimizer.load_state_dict(state)
    for group, kept in zip(optimizer.param_groups, flags, strict=True):
        group.update(kept)
