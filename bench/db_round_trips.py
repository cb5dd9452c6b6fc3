"""What one training step costs in round trips to the metadata database, per process, through the real SDK and
server: the `tinker_serve_db_statements` metric (app/db/statement_metrics.py) read from Ray's metrics endpoint
before and after `--steps` forward_backward + optim_step pairs (each awaited), minus what the same server sends
while idle for as long (heartbeats, sweeps, pollers). Prints statements per step by process and statement.

    python bench/db_round_trips.py [--steps 20]
"""

from __future__ import annotations

import argparse
import re
import socket
import time
from collections import Counter

from server import ROOT, start_server  # sets up sys.path and the environment first

from app.models.embedded import build_embedded_model

SERIES = re.compile(r"^ray_tinker_serve_db_statements(?:_total)?\{(.*)\} (\S+)$")


def read(port: int) -> Counter[tuple[str, str]]:
    """Statements counted so far, by (process, statement)."""
    import httpx

    counts: Counter[tuple[str, str]] = Counter()
    for line in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text.splitlines():
        match = SERIES.match(line)
        if match:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
            counts[(labels["process"], labels["statement"])] += int(float(match.group(2)))
    return counts


def settled(port: int) -> Counter[tuple[str, str]]:
    """The counts once Ray's exporter has caught up (two reads 6 s apart agree)."""
    last = read(port)
    while True:
        time.sleep(6)
        now = read(port)
        if now == last:
            return now
        last = now


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    import tinker
    from tinker import types

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = str(build_embedded_model("tiny", ROOT / "models" / "tiny"))
    base = {"name": "tinker-serve/tiny", "path": path, "trainer": {"num_workers": 1, "cpus_per_worker": 1}}
    url, _ = start_server([base], metrics_port=port, engine={"max_lora_rank": 8})
    client = tinker.ServiceClient(base_url=url, api_key="tml-bench")
    tc = client.create_lora_training_client(base_model="tinker-serve/tiny", rank=8, seed=1).result()
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(list(range(3, 67))),
        loss_fn_inputs={"target_tokens": list(range(4, 68)), "weights": [1.0] * 64},
    )

    def step() -> None:
        tc.forward_backward([datum] * 8, "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()

    for _ in range(3):  # warm-up
        step()
    before = settled(port)
    started = time.monotonic()
    for _ in range(args.steps):
        step()
    busy_s = time.monotonic() - started
    after = settled(port)
    window_s = time.monotonic() - started  # the steps, then the exporter catching up
    idle_started = time.monotonic()
    time.sleep(max(0.0, window_s - 12))
    idle = settled(port)
    idle_s = time.monotonic() - idle_started
    work, background = after - before, idle - after
    print(f"\n{args.steps} steps (8x64 forward_backward + optim_step, each awaited) in {busy_s:.1f} s")
    print(f"{'process':<9} {'statement':<28} {'per step':>9} {'idle, per step':>15}")
    beyond_idle: Counter[str] = Counter()
    for key in sorted(set(work) | set(background)):
        idle_share = background[key] * window_s / idle_s  # what idling as long as the steps' window sends
        beyond_idle[key[0]] += work[key] - idle_share
        print(f"{key[0]:<9} {key[1]:<28} {work[key] / args.steps:9.2f} {idle_share / args.steps:15.2f}")
    for process, count in sorted(beyond_idle.items()):
        print(f"{process}: {count / args.steps:.1f} statements per step beyond idle")
    client.close("success").result()


if __name__ == "__main__":
    main()
