"""The environment vLLM's engine runs in on CPU: the Sampler replica's, and the benchmarks' in-process engine."""

from __future__ import annotations

from pathlib import Path

from app.allocator import TCMALLOC, preload_tcmalloc

CPU_ENGINE_ENV = {
    "TORCH_COMPILE_DISABLE": "1",  # else the first logprobs request compiles for 15-30 s
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # "auto" pins every engine on a node to core 0
    # the model runs in vLLM's engine process: its multiprocess executor adds a worker process whose shared-memory
    # queues busy-wait for 1 s after every message, so engine and worker each hold a core while sampling
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}


def replica_env(tcmalloc: Path = TCMALLOC) -> dict[str, str]:
    """A CPU Sampler replica's environment: CPU_ENGINE_ENV, and tcmalloc preloaded where it is installed
    (app.allocator; set `sampler.env.LD_PRELOAD` to "" to go without)."""
    return {**CPU_ENGINE_ENV, **preload_tcmalloc(tcmalloc)}
