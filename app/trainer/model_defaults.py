"""The worker-group settings left at `auto`, chosen from the base model: a config that names a tiny model and one
that names a real one need no lines of their own.

- `sharding: auto`: replicate when the base's weight files total at most REPLICATE_AT_MOST_BYTES (every rank keeps
  all of it and no layer's weights are gathered: the fastest while it is small), else fsdp (each rank holds
  1/num_workers of it). Unknown size (a Hub id not in the local cache): fsdp.
- `activation_checkpointing: auto`: off when one pass of micro_batch_tokens needs at most PLAIN_PASS_AT_MOST_BYTES of
  activations without it (app.trainer.memory_estimate, in the trainer's dtype), else on. Unknown shape: on.

The embedded tiny model resolves to replicate / off, a 0.6B shape to fsdp / on: a 1 x 8,192 step with the tiny
model's settings kept took a 0.6B rank to 15.9 GiB and the workers were killed for memory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.config import WorkerGroupConfig
from app.models.model_config import read_model_config
from app.models.precision import DTYPE_BYTES, resolve_dtype
from app.trainer.memory_estimate import estimate_activation_bytes

REPLICATE_AT_MOST_BYTES = 512 * 2**20
PLAIN_PASS_AT_MOST_BYTES = 2 * 2**30
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")


def for_model(shape: WorkerGroupConfig, model_path: str) -> tuple[WorkerGroupConfig, list[str]]:
    """`shape` with its auto settings chosen for the base at `model_path`, and a line on each choice (none when
    nothing was auto). Idempotent: a resolved shape comes back as it is."""
    updates: dict[str, Any] = {}
    reasons: list[str] = []
    if shape.sharding == "auto":
        weights = weight_bytes(model_path)
        small = weights is not None and weights <= REPLICATE_AT_MOST_BYTES
        updates["sharding"] = "replicate" if small else "fsdp"
        size = "unknown" if weights is None else f"{weights / 2**20:,.0f} MiB"
        reasons.append(
            f"sharding {updates['sharding']} (weights {size}; replicate at most {_mib(REPLICATE_AT_MOST_BYTES)})"
        )
    if shape.activation_checkpointing == "auto":
        plain = _plain_pass_bytes(shape, model_path)
        updates["activation_checkpointing"] = plain is None or plain > PLAIN_PASS_AT_MOST_BYTES
        need = "unknown" if plain is None else f"~{plain / 2**30:.1f} GiB"
        reasons.append(
            f"activation checkpointing {'on' if updates['activation_checkpointing'] else 'off'} (a "
            f"{shape.micro_batch_tokens}-token pass without it: {need}; off at most {_mib(PLAIN_PASS_AT_MOST_BYTES)})"
        )
    return shape.model_copy(update=updates), reasons


def weight_bytes(model_path: str) -> int | None:
    """The bytes of the base's weight files: a local directory's, or a Hub id's snapshot in the local cache (nothing
    is downloaded); None when they cannot be found."""
    directory = Path(model_path)
    if not directory.is_dir():
        from huggingface_hub import try_to_load_from_cache

        config = try_to_load_from_cache(model_path, "config.json")
        if not isinstance(config, str):
            return None
        directory = Path(config).parent
    files = [f for f in directory.iterdir() if f.name.endswith(_WEIGHT_SUFFIXES)]
    return sum(f.stat().st_size for f in files) if files else None  # a cache snapshot's files are links: stat follows


def _plain_pass_bytes(shape: WorkerGroupConfig, model_path: str) -> int | None:
    config = read_model_config(model_path)
    if config is None:
        return None
    dtype_bytes = DTYPE_BYTES.get(resolve_dtype(shape.dtype, shape.use_gpu), 4)
    try:
        return estimate_activation_bytes(config, shape.micro_batch_tokens, dtype_bytes, checkpointing=False)
    except (KeyError, TypeError, ValueError):  # not a decoder the estimate models
        return None


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"
