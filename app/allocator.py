"""tcmalloc for the processes that compute on CPUs: the Sampler's vLLM engine and the trainer's ranks.

Debian's libtcmalloc-minimal4 (`make setup` installs it as root). glibc's malloc keeps the freed activations of a
long forward/backward in its heap (the size classes of a layer's tensors sit under its dynamic mmap threshold), so a
rank's resident memory grows with every layer it recomputes; tcmalloc reuses them. Measured in process
(bench/sequence_parallel.py, a 0.6B-shaped model cut to 8 layers, one 4,096-token datum on 2 ranks): the rank's peak
growth 0.72 GiB instead of 2.56, the step 0.94x the time. For the Sampler, vLLM's CPU advice (warm sampling
1.14-1.23x through the server, bench/peer_compare.py --servers ours,preload). The ingress does not preload it: with
tcmalloc in every process its round trips got slower.
"""

from __future__ import annotations

from pathlib import Path

TCMALLOC = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")


def preload_tcmalloc(tcmalloc: Path = TCMALLOC) -> dict[str, str]:
    """LD_PRELOAD of tcmalloc where it is installed, else nothing (a process's own `env` may set LD_PRELOAD to ""
    to go without)."""
    return {"LD_PRELOAD": str(tcmalloc)} if tcmalloc.exists() else {}
