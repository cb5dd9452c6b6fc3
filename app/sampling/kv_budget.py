"""`sampler.kv_cache_mib: auto` on CPU: a KV cache that holds one whole context of the base model, at least
AUTO_FLOOR_MIB (room for many short sequences at once), at most 1/AUTO_MEMORY_SHARE of the machine's memory. The
tiny model gets the floor; a 0.6B shape its whole 40,960-token context where the memory allows (4.4 GiB), else as
much as the share holds (the context then follows the cache: deployments.builder)."""

from __future__ import annotations

import math
import os

from app.models.model_config import VLLM_CPU_BLOCK_TOKENS, ModelShape

AUTO_FLOOR_MIB = 256
AUTO_MEMORY_SHARE = 8


def machine_memory_bytes() -> int:
    """This machine's physical memory."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def auto_kv_cache_mib(shape: ModelShape, context: int, dtype_bytes: int, memory_bytes: int) -> tuple[int, str]:
    """The KV cache in MiB for `context` tokens of `shape` in a dtype of `dtype_bytes` on a machine with
    `memory_bytes`, and a line saying why."""
    cap = max(AUTO_FLOOR_MIB, memory_bytes // AUTO_MEMORY_SHARE // 2**20)
    if not shape.kv_values_per_token:  # no softmax attention layers to cache
        return AUTO_FLOOR_MIB, f"kv_cache_mib {AUTO_FLOOR_MIB} (the model keeps no per-token KV)"
    blocks = math.ceil(context / VLLM_CPU_BLOCK_TOKENS) + 1  # whole blocks, and the one vLLM's pool keeps back
    whole = math.ceil(blocks * VLLM_CPU_BLOCK_TOKENS * shape.kv_values_per_token * dtype_bytes / 2**20)
    mib = min(max(AUTO_FLOOR_MIB, whole), cap)
    return mib, (
        f"kv_cache_mib {mib} (one {context}-token context: {whole} MiB; at least {AUTO_FLOOR_MIB}, at most "
        f"1/{AUTO_MEMORY_SHARE} of this machine's {memory_bytes / 2**30:.0f} GiB)"
    )
