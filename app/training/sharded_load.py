"""Load the frozen base already sharded: each rank reads only its own rows of every weight from the checkpoint.

The model is built with its parameters on the meta device (its buffers, the rotary frequencies, computed as usual),
given `shard_base`'s FSDP2 layout, its local shards allocated, and each shard filled from the safetensors files: a
rank's host memory while loading is its shard plus one slice of one tensor, not the whole base. The result is exactly
`load_base_model` then `shard_base`'s. A checkpoint that does not hold the model's parameters under their own names
and shapes (transformers renames or converts some families' keys as it loads them, e.g. fused MoE experts) is loaded
that way instead.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from accelerate import init_empty_weights  # a dependency of peft
from safetensors import safe_open
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from transformers import PreTrainedModel
from transformers.conversion_mapping import get_model_conversion_mapping

from app.models.families import family_of, model_class
from app.models.model_config import transformers_config
from app.training.base_model import load_base_model, shard_base, without_vision_tower

logger = logging.getLogger("tinker_serve.worker")

Checkpoint = dict[str, tuple[Path, list[int]]]  # each tensor's file and shape, by name


def load_sharded_base(
    path: str, dtype: torch.dtype, device: str = "cpu", shard_group_size: int | None = None
) -> torch.nn.Module:
    """The base at `path` (a directory) as `load_base_model(path, dtype)` then `shard_base` leave it, on `device`,
    each rank reading only its shard of each weight where the checkpoint allows (else the whole base, logged)."""
    model = _empty_base(path, dtype)
    checkpoint = _checkpoint(Path(path))
    reason = _whole_load_reason(model, checkpoint, dtype)
    if reason is not None:
        logger.info("%s: %s; each rank loads the whole base, then shards it", path, reason)
        whole = load_base_model(path, dtype)
        shard_base(whole, torch.device(device).type, shard_group_size)
        return whole
    shard_base(model, torch.device(device).type, shard_group_size)
    buffers = dict(model.named_buffers())  # to_empty leaves every tensor uninitialised, these too
    model.to_empty(device=device)
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            buffer.copy_(buffers[name])
        for name, param in model.named_parameters():  # a tied weight once, under its first name (the embedding's)
            _read_shard(param, name, checkpoint[name][0])
    return model


def _empty_base(path: str, dtype: torch.dtype) -> PreTrainedModel:
    """The model `load_base_model` builds, frozen and in eval mode, with its parameters on the meta device."""
    config = transformers_config(path)
    family = family_of(config.model_type)
    with init_empty_weights(include_buffers=False):
        model: PreTrainedModel = model_class(family).from_config(
            config, dtype=dtype, attn_implementation=family.trainer_attention
        )
    without_vision_tower(model, family)
    model.tie_weights()  # again: under init_empty_weights, tying gave the LM head a meta weight of its own
    model.requires_grad_(False)
    return model.eval()


def _checkpoint(directory: Path) -> Checkpoint:
    """The tensors of the safetensors checkpoint in `directory` (one file, or several with an index); none when it has
    no such checkpoint."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        files = sorted({directory / name for name in json.loads(index.read_text())["weight_map"].values()})
    else:
        files = [file for file in [directory / "model.safetensors"] if file.is_file()]
    tensors: Checkpoint = {}
    for file in files:
        with safe_open(file, framework="pt") as f:
            tensors |= {name: (file, f.get_slice(name).get_shape()) for name in f.keys()}  # noqa: SIM118 - not iterable
    return tensors


def _whole_load_reason(model: PreTrainedModel, checkpoint: Checkpoint, dtype: torch.dtype) -> str | None:
    """Why from_pretrained would load `checkpoint` into `model` otherwise than tensor by tensor under the parameters'
    names, cast to `dtype`; None when it would not."""
    if not checkpoint:
        return "no safetensors checkpoint in the directory"
    if getattr(model.config, "quantization_config", None):
        return "the checkpoint is quantized"
    if get_model_conversion_mapping(model, add_legacy=False):
        return f"transformers converts {model.config.model_type} checkpoints' keys as it loads them"
    if dtype != torch.float32 and (model._keep_in_fp32_modules or model._keep_in_fp32_modules_strict):
        return "the model keeps some modules in float32"
    if {name for name, _ in model.named_buffers()} - {name for name, _ in model.named_non_persistent_buffers()}:
        return "the model has buffers saved in its checkpoint"
    unmatched = [
        name
        for name, param in model.named_parameters()
        if name not in checkpoint or checkpoint[name][1] != list(param.shape)
    ]
    if unmatched:
        return f"{len(unmatched)} parameters have no checkpoint tensor of their name and shape (as {unmatched[0]})"
    return None


def _read_shard(param: torch.Tensor, name: str, file: Path) -> None:
    """Copy this rank's part of checkpoint tensor `name` into the sharded parameter's local tensor (in its dtype)."""
    assert isinstance(param, DTensor)
    local = param.to_local()
    if not local.numel():  # a rank past the last rows (FSDP2 splits as torch.chunk does)
        return
    _, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    rows = tuple(slice(start, start + size) for start, size in zip(offset, local.shape, strict=True))
    # The file is mapped into memory, and the pages read count in the process's resident memory while it stays
    # mapped: opened for one tensor, it is unmapped after it (one file held open for all its tensors had a rank's
    # peak at its shard plus its part of the whole file).
    with safe_open(file, framework="pt") as f:
        local.copy_(f.get_slice(name)[rows])
