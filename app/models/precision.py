"""Which floating-point type a base model runs in (`trainer.dtype`, `sampler.dtype`): no torch here, so the config
checks and the Sampler resolve `auto` the same way the training workers do.

`auto` is bfloat16 on GPUs, and on CPUs with bfloat16 matrix instructions (Intel AMX or AVX512-BF16, the flags
oneDNN uses): on a 2-core Sapphire Rapids VM a [2048, 1024] x [1024, 3072] matmul ran at 1,144 GFLOP/s in bfloat16
against 122 in float32 on one thread (docs/guides/large-models.md). Elsewhere float32, which CPUs without them run faster.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Literal

DtypeSetting = Literal["auto", "float32", "bfloat16"]
DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
_CPU_BF16_FLAGS = frozenset({"amx_bf16", "avx512_bf16"})


@cache
def cpu_has_fast_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this CPU has bfloat16 matrix instructions (Linux: its cpuinfo flags; elsewhere no)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("flags"):
            return bool(_CPU_BF16_FLAGS & set(line.split(":", 1)[1].split()))
    return False


def resolve_dtype(setting: DtypeSetting, on_gpu: bool) -> Literal["float32", "bfloat16"]:
    """The dtype `setting` means on this machine."""
    if setting != "auto":
        return setting
    return "bfloat16" if on_gpu or cpu_has_fast_bf16() else "float32"
