"""The environment vLLM's engine runs in on CPU: the Sampler replica's, and the benchmarks' in-process engine."""

from __future__ import annotations

from pathlib import Path

CPU_ENGINE_ENV = {
    "TORCH_COMPILE_DISABLE": "1",  # else the first logprobs request compiles for 15-30 s
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # "auto" pins every engine on a node to core 0
    # the model runs in vLLM's engine process: its multiprocess executor adds a worker process whose shared-memory
    # queues busy-wait for 1 s after every message, so engine and worker each hold a core while sampling
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}

# Debian's libtcmalloc-minimal4 (`make setup` installs it as root). vLLM's CPU advice; measured through the server
# (bench/peer_compare.py --servers ours,preload): warm sampling 1.14-1.23x. Only the Sampler preloads it: in every
# process the ingress's round trips got slower.
TCMALLOC = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")


def replica_env(tcmalloc: Path = TCMALLOC) -> dict[str, str]:
    """A CPU Sampler replica's environment: CPU_ENGINE_ENV, and tcmalloc preloaded where it is installed (set
    `sampler.env.LD_PRELOAD` to "" to go without)."""
    return {**CPU_ENGINE_ENV, **({"LD_PRELOAD": str(tcmalloc)} if tcmalloc.exists() else {})}
