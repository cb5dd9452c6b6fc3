"""Ray Serve's request-path settings this project runs with.

Serve reads them from the environment when its controller, proxies and replicas start, so they belong in the
environment of whatever starts Ray: `make serve` exports them (the Makefile lists the same values; a unit test keeps
the two equal), the tests and benchmarks call `apply()` before `ray.init`, and the manifests in deploy/ set them on
the Ray containers. They are part of what Serve's own `RAY_SERVE_THROUGHPUT_OPTIMIZED` sets, less gRPC between
handles and replicas (Serve then caps a replica's request at 4 MiB: a training batch is larger), direct ingress (it
needs a port range per node) and buffered request logs (Serve flushes them only every 1000 lines or on an error, so a
replica's log would trail its requests by minutes). bench/request_path.py measures them: through the proxy,
`healthz` and `get_info` took about half the time with them (README, "Tests and benchmarks").
"""

from __future__ import annotations

import os

SERVE_ENV: dict[str, str] = {
    # replicas run our handlers on their own event loop instead of a second thread's: a request no longer crosses
    # threads twice. Nothing of ours blocks a replica's loop (the trainer's Ray Train run has its own thread).
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
    # the proxy's and the ingress's handles route on the caller's loop, not on a loop of their own
    "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0",
}


def apply() -> None:
    """Set every value that the environment does not already set (call before Ray starts)."""
    for name, value in SERVE_ENV.items():
        os.environ.setdefault(name, value)
