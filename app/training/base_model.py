"""How a rank holds the frozen base model: loaded in its dtype, optionally sharded across the worker group with FSDP2,
optionally recomputing each decoder layer's activations in the backward pass instead of keeping them.

Sharding (`shard_base`) puts each decoder layer, and then the rest of the model (embeddings, final norm, LM head) in
one more unit, under `torch.distributed.fsdp.fully_shard`: every rank keeps 1/N of each frozen weight and gathers a
unit's full weights just before that unit runs (forward, and again for the backward), freeing them right after.
LoRA adapters and value heads are added afterwards, as plain (replicated) tensors FSDP does not manage: they stay
float32 on every rank, and their gradients are summed across ranks at optim_step as without sharding. Every rank
must then run the same sequence of forward and backward passes (app.training.engine runs idle passes on a rank
with fewer datums), since each unit's gather is a collective.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.checkpoint import checkpoint

from app.models.families import Family, family_of, model_class
from app.models.model_config import transformers_config

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def load_base_model(path: str, dtype: torch.dtype = torch.float32, device: str = "cpu") -> torch.nn.Module:
    """The base model at `path` in `dtype`, frozen, in eval mode (no dropout), with its family's attention: SDPA
    where transformers has it (memory-efficient kernels on CPU and GPU: no [tokens, tokens] score matrix is kept)."""
    config = transformers_config(path)  # read once: the family's attention, then the model
    family = family_of(config.model_type)
    model: torch.nn.Module = model_class(family).from_pretrained(
        path, config=config, dtype=dtype, attn_implementation=family.trainer_attention
    )
    without_vision_tower(model, family)
    for p in model.parameters():
        p.requires_grad_(False)
    return model.to(device).eval()


def without_vision_tower(model: torch.nn.Module, family: Family) -> None:
    """Drop a whole vision-language model's vision tower, in place (a family transformers builds no language model
    alone for: `Family.causal_lm`); the ranks' app.training.vision holds the frozen tower apart."""
    if not family.causal_lm:
        del model.get_submodule("model").visual


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks: the modules Hugging Face says not to split (`_no_split_modules`; sharded ones
    too, whose class FSDP replaced with a subclass)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if any(c.__name__ in names for c in type(m).__mro__)]
    if not layers:
        raise ValueError(f"{type(model).__name__} names no decoder layer class (_no_split_modules)")
    return layers


def recompute_activations(model: torch.nn.Module) -> None:
    """Keep only each decoder layer's input for the backward pass and recompute the rest when it is needed
    (non-reentrant activation checkpointing): activation memory per token is then the hidden state once per layer,
    for about one more forward pass of compute. Parameter names do not change (adapters save as before)."""
    for layer in decoder_layers(model):
        layer.forward = functools.partial(_checkpointed, layer.forward)


def _checkpointed(forward: Any, *args: Any, **kwargs: Any) -> Any:
    if not torch.is_grad_enabled():  # a forward-only pass keeps nothing anyway
        return forward(*args, **kwargs)
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def shard_base(model: torch.nn.Module, device_type: str, shard_group_size: int | None = None) -> None:
    """Shard the model's weights across the default process group with FSDP2, in place (it moves them to the
    group's device). `shard_group_size` < world size shards within groups of that many ranks and replicates across
    groups (hybrid sharding: gathers stay inside a group, e.g. a node)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    world = dist.get_world_size()
    size = shard_group_size or world
    if size < 1 or world % size:
        raise ValueError(f"shard_group_size {size} does not divide the worker group's {world} ranks")
    # A group shards over its own ranks, and every group loads the same weights: the frozen base needs no
    # reduction across groups, so plain FSDP on the group's sub-mesh is hybrid sharding here. The dimension is named
    # "fsdp" because PEFT sizes the adapters of a layer whose weight lives on a mesh with any other dimension name
    # as tensor parallel (from the local shard).
    if size == world:
        mesh = init_device_mesh(device_type, (world,), mesh_dim_names=("fsdp",))
    else:
        mesh = init_device_mesh(device_type, (world // size, size), mesh_dim_names=("replicate", "fsdp"))["fsdp"]
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


def reshard(model: torch.nn.Module) -> None:
    """Free the weights FSDP2 gathered and kept (the outermost unit keeps its gathered weights after a pass with no
    backward), on every rank alike: then nothing a rank does alone, e.g. a save on rank 0 alone, changes what the next
    pass gathers. `state_dict()` reshards a gathered unit first, on that rank only; its next pass then gathered once
    more than the others', and the ranks' gathers no longer matched (gloo: "Received data size doesn't match expected
    size"). A no-op on a model not sharded."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
