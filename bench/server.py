"""Starts the real Serve app on loopback for a benchmark, in a private Ray instance."""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TINKER_TELEMETRY", "0")

from deployments import serve_env  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


serve_env.apply(_free_port())  # as `make serve` runs Serve: the Ingress replica answers on this port itself
PROXY_PORT = _free_port()  # Serve's Python proxy, which still runs beside it (bench/request_path.py times both)

APP_NAME = "bench"


def start_server(base_models: list[dict], metrics_port: int | None = None, **config: object) -> tuple[str, Path]:
    """Deploy the app with these base models (and any other top-level config); once it is ready, returns
    its URL and state directory. `metrics_port`: where Ray's metrics endpoint listens (on this node)."""
    import httpx
    import ray
    from ray import serve

    from deployments.builder import build_app

    ray.init(
        num_cpus=8,
        include_dashboard=False,
        log_to_driver=False,
        _temp_dir=f"/tmp/tsbench-{os.getpid()}",
        **({"_metrics_export_port": metrics_port} if metrics_port else {}),
    )
    serve.start(http_options={"host": "127.0.0.1", "port": PROXY_PORT})
    state_dir = Path(tempfile.mkdtemp(prefix="tsbench-"))
    full = {
        "state_dir": str(state_dir),
        "auth": {"mode": "any_tml_key_on_loopback"},
        "base_models": base_models,
        **config,
    }
    started = time.monotonic()
    serve.run(build_app(full), name=APP_NAME, route_prefix="/")
    url = f"http://127.0.0.1:{serve_env.direct_port()}"
    while httpx.get(f"{url}/ready", timeout=10).status_code != 200:
        time.sleep(1)
    print(f"server ready in {time.monotonic() - started:.0f} s at {url}", flush=True)
    return url, state_dir
