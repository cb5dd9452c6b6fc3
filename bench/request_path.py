"""Small-request latency through Serve's HTTP proxy: the real app's `healthz`, `get_server_capabilities` (a key),
`get_info` (a key and a model's row) and `retrieve_future` of a finished future, against Serve's floor: a
deployment with one FastAPI route that returns a constant, in the same Serve instance, rounds interleaved.
Medians over repeats of each round's p50. Targets (issue 19): healthz <= 2 ms, get_info <= 5 ms.

    python bench/request_path.py [--requests 300] [--repeats 5]

Serve's own settings matter most here; the script reports the RAY_SERVE_* variables it ran with (bench/server.py
applies the project's defaults from deployments/serve_env.py, as `make serve` does).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

from server import ROOT, start_server  # sets up sys.path and the environment first

from app.models.embedded import build_embedded_model

KEY = "tml-bench-requests"


def floor_app() -> object:
    """Serve's floor: one FastAPI route returning a constant, behind the same proxy."""
    from fastapi import FastAPI
    from ray import serve

    api = FastAPI()

    @api.get("/")
    async def constant() -> dict:
        return {"status": "ok"}

    @serve.deployment(ray_actor_options={"num_cpus": 0})
    @serve.ingress(api)
    class Floor:
        pass

    return Floor.bind()  # type: ignore[attr-defined]


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
    from ray import serve

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
    serve.run(floor_app(), name="floor", route_prefix="/floor")
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

    def ok(response: httpx.Response) -> None:
        response.raise_for_status()

    calls: dict[str, Callable[[], object]] = {
        "serve floor (constant route)": lambda: ok(http.get("/floor/")),
        "healthz": lambda: ok(http.get("/api/v1/healthz")),
        "get_server_capabilities (key)": lambda: ok(http.get("/api/v1/get_server_capabilities")),
        "get_info (key + model row)": lambda: ok(
            http.post("/api/v1/get_info", json={"model_id": model_id, "type": "get_info"})
        ),
        "retrieve_future (finished)": lambda: ok(http.post("/api/v1/retrieve_future", json={"request_id": request_id})),
    }
    runs: dict[str, list[float]] = {name: [] for name in calls}
    for repeat in range(args.repeats):
        for name, call in calls.items():
            runs[name].append(p50_ms(call, args.requests))
        print(f"repeat {repeat + 1}/{args.repeats}: " + ", ".join(f"{v[-1]:.2f}" for v in runs.values()), flush=True)

    floor = statistics.median(runs["serve floor (constant route)"])
    print(f"\nRAY_SERVE_* in effect: {sorted((k, v) for k, v in os.environ.items() if k.startswith('RAY_SERVE_'))}")
    print(f"load average: {os.getloadavg()}")
    print(f"{'route':34} {'p50 ms (median)':>16} {'/ floor':>8}")
    for name, values in runs.items():
        median = statistics.median(values)
        print(f"{name:34} {median:16.2f} {median / floor:8.2f}")
    healthz, info = statistics.median(runs["healthz"]), statistics.median(runs["get_info (key + model row)"])
    print(f"target healthz <= 2 ms: {'met' if healthz <= 2 else 'NOT met'} ({healthz:.2f})")
    print(f"target get_info <= 5 ms: {'met' if info <= 5 else 'NOT met'} ({info:.2f})")


if __name__ == "__main__":
    main()
