"""Small-request latency on the two ways into the app, in the same Serve instance, rounds interleaved: the Ingress
replica's own server (Serve's direct ingress, what `make serve` uses) and Serve's Python HTTP proxy, which still runs
beside it (the path before direct ingress). Routes: `healthz`, `get_server_capabilities` (a key), `get_info` (a key
and a model's row) and `retrieve_future` of a finished future. Medians over repeats of each round's p50. Targets
(issue 33): healthz <= 1 ms; get_info is compared with the peer by bench/peer_compare.py.

    python bench/request_path.py [--requests 300] [--repeats 5]

Serve's own settings matter most here; the script reports the RAY_SERVE_* variables it ran with (bench/server.py
applies the project's defaults from deployments/serve_env.py, as `make serve` does).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from collections.abc import Callable

from server import PROXY_PORT, ROOT, start_server  # sets up sys.path and the environment first

from app.models.embedded import build_embedded_model

KEY = "tml-bench-requests"


def p50_ms(call: Callable[[], object], requests: int) -> float:
    call()  # warm: the connection, caches
    times = []
    for _ in range(requests):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    import httpx
    import tinker

    tiny = ROOT / "models" / "tiny"
    build_embedded_model("tiny", tiny)
    url, _ = start_server(
        [
            {
                "name": "tinker-serve/tiny",
                "path": str(tiny),
                "embedded_preset": "tiny",
                "trainer": {"num_workers": 1, "cpus_per_worker": 0.25},
                "sampler": {"num_cpus": 0.5, "kv_cache_mib": 64},
            }
        ]
    )
    service = tinker.ServiceClient(base_url=url, api_key=KEY)
    model_id = service.create_lora_training_client("tinker-serve/tiny", rank=8).result().model_id
    http = httpx.Client(base_url=url, headers={"X-API-Key": KEY}, timeout=30)
    save = {"model_id": model_id, "path": "bench", "seq_id": 1, "type": "save_weights"}  # the model's next seq_id
    saving = http.post("/api/v1/save_weights", json=save)
    assert saving.status_code == 200, saving.text
    request_id = saving.json()["request_id"]
    while (done := http.post("/api/v1/retrieve_future", json={"request_id": request_id}).json()).get("type") == (
        "try_again"
    ):
        pass  # a long-poll: a finished future is what the route below times
    assert "path" in done, done
    paths = {"direct": http, "proxy": httpx.Client(base_url=f"http://127.0.0.1:{PROXY_PORT}", headers=http.headers)}

    def route(method: str, path: str, body: dict | None = None) -> Callable[[httpx.Client], None]:
        def call(client: httpx.Client) -> None:
            client.request(method, path, json=body).raise_for_status()

        return call

    routes = {
        "healthz": route("GET", "/api/v1/healthz"),
        "get_server_capabilities (key)": route("GET", "/api/v1/get_server_capabilities"),
        "get_info (key + model row)": route("POST", "/api/v1/get_info", {"model_id": model_id, "type": "get_info"}),
        "retrieve_future (finished)": route("POST", "/api/v1/retrieve_future", {"request_id": request_id}),
    }
    runs: dict[tuple[str, str], list[float]] = {(r, p): [] for r in routes for p in paths}
    for repeat in range(args.repeats):
        for (name, path), values in runs.items():
            values.append(p50_ms(functools.partial(routes[name], paths[path]), args.requests))
        print(f"repeat {repeat + 1}/{args.repeats}: " + ", ".join(f"{v[-1]:.2f}" for v in runs.values()), flush=True)

    print(f"\nRAY_SERVE_* in effect: {sorted((k, v) for k, v in os.environ.items() if k.startswith('RAY_SERVE_'))}")
    print(f"load average: {os.getloadavg()}")
    print(f"{'route':32} {'direct p50 ms':>14} {'proxy p50 ms':>13} {'direct/proxy':>13}")
    for name in routes:
        direct, proxy = (statistics.median(runs[name, path]) for path in paths)
        print(f"{name:32} {direct:14.2f} {proxy:13.2f} {direct / proxy:13.2f}")
    healthz = statistics.median(runs["healthz", "direct"])
    print(f"target healthz <= 1 ms: {'met' if healthz <= 1 else 'NOT met'} ({healthz:.2f})")


if __name__ == "__main__":
    main()
