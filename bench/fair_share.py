"""Fair-share benchmark: how long user B's single forward_backward waits while user A has 20 steps queued on the
same trainer (B submits once all of A's flood is queued), with fair share (the default depth, `max_dispatched_runs`
2) and without (a depth so large that every run is sent as soon as it is ready: the scheduling before fair share).

    python bench/fair_share.py [--preset tiny] [--depths 2,100000] [--repeats 3] [--steps 20]

Each depth runs in a server of its own (a child process). Prints, per depth, the medians over the repeats of B's
wait, of A's step time (awaited one at a time) and of A's step time within the flood, then the ratio of the waits.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import threading
import time
from pathlib import Path

from children import results_per_setting  # bench/ is the script's directory

ADAM_LR = 1e-4


def _wait_all(futures: list[tuple]) -> None:
    for fb, opt in futures:
        fb.result(), opt.result()


def last_queued_seq(state_dir: Path, model_id: str) -> int:
    """The model's highest seq_id the ingress has accepted (its future exists; the trainer gets it at once)."""
    with sqlite3.connect(state_dir / "tinker_serve.db") as db:
        query = "SELECT coalesce(max(seq_id), 0) FROM futures WHERE subject_id = ?"
        return db.execute(query, (model_id,)).fetchone()[0]


def measure(
    url: str, state_dir: Path, name: str, steps: int, repeats: int, datums: int, length: int
) -> dict[str, list[float]]:
    """Per repeat: B's wait under A's flood, A's awaited step time and A's step time in the flood (the whole flood,
    B's step included, over its steps), both users on `name`'s trainer."""
    import tinker
    from tinker import types

    alice_sc = tinker.ServiceClient(base_url=url, api_key="tml-bench-alice")
    bob_sc = tinker.ServiceClient(base_url=url, api_key="tml-bench-bob")
    alice = alice_sc.create_lora_training_client(base_model=name, rank=8, seed=0).result()
    bob = bob_sc.create_lora_training_client(base_model=name, rank=8, seed=1).result()
    ids = list(range(3, 3 + length + 1))
    data = [
        types.Datum(
            model_input=types.ModelInput.from_ints(ids[:-1]),
            loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * length},
        )
    ] * datums
    adam = types.AdamParams(learning_rate=ADAM_LR)
    bob.forward_backward(data, "cross_entropy").result()
    waits, step_times, flood_steps = [], [], []
    for _ in range(repeats):
        started = time.perf_counter()
        alice.forward_backward(data, "cross_entropy").result()
        alice.optim_step(adam).result()
        step_times.append(time.perf_counter() - started)
        last_before = last_queued_seq(state_dir, alice.model_id)
        flood_started = time.perf_counter()
        flood = [(alice.forward_backward(data, "cross_entropy"), alice.optim_step(adam)) for _ in range(steps)]
        waiter = threading.Thread(target=_wait_all, args=(flood,))
        waiter.start()
        while last_queued_seq(state_dir, alice.model_id) < last_before + 2 * steps:  # the whole flood is queued
            time.sleep(0.01)
        submitted = time.perf_counter()
        bob.forward_backward(data, "cross_entropy").result()
        waits.append(time.perf_counter() - submitted)
        waiter.join()
        flood_steps.append((time.perf_counter() - flood_started) / steps)
    alice_sc.close("success").result()
    bob_sc.close("success").result()
    return {"waits": waits, "steps": step_times, "flood_steps": flood_steps}


def child(args: argparse.Namespace) -> None:
    from server import ROOT, start_server  # sets up sys.path and the environment first

    from app.models.embedded import build_embedded_model

    path = build_embedded_model(args.preset, ROOT / "models" / args.preset)
    name = f"tinker-serve/{args.preset}"
    trainer = {"num_workers": 2, "cpus_per_worker": 1, "max_dispatched_runs": args.depth}
    url, state_dir = start_server([{"name": name, "path": str(path), "trainer": trainer}])
    result = measure(url, state_dir, name, args.steps, args.repeats, args.datums, args.length)
    print("RESULT " + json.dumps(result), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny", choices=["tiny", "small"])
    parser.add_argument("--depths", default="2,100000", help="max_dispatched_runs values to compare")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--datums", type=int, default=16)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--depth", type=int, help=argparse.SUPPRESS)  # child mode: one server at this depth
    args = parser.parse_args()
    if args.depth is not None:
        child(args)
        return
    rows = results_per_setting(__file__, "--depth", (int(d) for d in args.depths.split(",")))
    for depth, row in rows.items():
        print(f"depth {depth}: B's waits {[round(w, 3) for w in row['waits']]}", flush=True)
    print(f"\n{'max_dispatched_runs':>20} {'B wait s':>9} {'A step s':>9} {'wait/step':>10} {'flood s/step':>13}")
    medians = {}
    for depth, row in rows.items():
        wait, step = statistics.median(row["waits"]), statistics.median(row["steps"])
        medians[depth] = wait
        print(f"{depth:>20} {wait:9.3f} {step:9.3f} {wait / step:10.2f} {statistics.median(row['flood_steps']):13.3f}")
    first, *rest = medians
    for depth in rest:
        print(f"B's wait at depth {depth} / at depth {first}: {medians[depth] / medians[first]:.1f}x")


if __name__ == "__main__":
    main()
