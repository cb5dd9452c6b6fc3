"""Many users, one pass: N users (1, 2, 4, 8) each step concurrently (forward_backward + optim_step of 8 datums x 64
tokens, `--steps` steps submitted at once, as the cookbook's pipelined loops do) on one trainer through the server,
with passes of several models' steps (`worker_group.mixed_pass_models` 8, the default) and without (1: one model at a
time), each in a server of its own (a child process), in the same run.

    python bench/many_users.py [--preset tiny] [--users 1,2,4,8] [--mix 1,8] [--steps 10] [--repeats 3]

Prints, per setting and N: the aggregate trained tokens/s and its ratio to one user alone, each user's step time
and its ratio to one user alone (medians over the repeats), and where the machine's CPU time went meanwhile (the
training ranks, the Ingress, the Trainer, the SDK clients, the rest); then, per N, mixed over unmixed throughput.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time

from children import results_per_setting  # bench/ is the script's directory

ADAM_LR = 1e-4
ROLES = {"RayTrainWorker": "ranks", "Ingress": "ingress", "Trainer": "trainer"}  # by process title


def cpu_seconds() -> dict[str, float]:
    """CPU seconds used so far by each role's processes (this process: the SDK clients; the rest: Ray, Serve, the
    Sampler)."""
    import os

    import psutil

    used: dict[str, float] = {}
    for process in psutil.process_iter(["pid", "cmdline", "cpu_times"]):
        times = process.info["cpu_times"]
        if times is None:
            continue
        title = " ".join(process.info["cmdline"] or [])
        role = "clients" if process.info["pid"] == os.getpid() else "rest"
        role = next((r for key, r in ROLES.items() if key in title), role)
        used[role] = used.get(role, 0.0) + times.user + times.system
    return used


def _steps(tc, data: list, adam, steps: int, started: float, own: list[float], u: int) -> None:  # type: ignore[no-untyped-def]
    """One user's `steps` steps, all submitted at once; their time since `started` goes into `own[u]`."""
    futures = [(tc.forward_backward(data, "cross_entropy"), tc.optim_step(adam)) for _ in range(steps)]
    for fb, opt in futures:
        fb.result(), opt.result()
    own[u] = time.perf_counter() - started


def measure(url: str, name: str, users: list[int], steps: int, repeats: int, datums: int, length: int) -> dict:
    """Per N and repeat: the wall time of N users' `steps` steps at once, and each user's own time."""
    import tinker
    from tinker import types

    clients = [tinker.ServiceClient(base_url=url, api_key=f"tml-bench-user-{u}") for u in range(max(users))]
    models = [sc.create_lora_training_client(base_model=name, rank=8, seed=u).result() for u, sc in enumerate(clients)]
    ids = list(range(3, 3 + length + 1))
    data = [
        types.Datum(
            model_input=types.ModelInput.from_ints(ids[:-1]),
            loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * length},
        )
    ] * datums
    adam = types.AdamParams(learning_rate=ADAM_LR)
    for tc in models:  # warm: every model has stepped once
        tc.forward_backward(data, "cross_entropy").result()
        tc.optim_step(adam).result()
    result: dict[str, dict[str, list[float]]] = {}
    for n in users:
        walls, user_steps = [], []
        before = cpu_seconds()
        for _ in range(repeats):
            own = [0.0] * n
            started = time.perf_counter()
            threads = [
                threading.Thread(target=_steps, args=(models[u], data, adam, steps, started, own, u)) for u in range(n)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            walls.append(time.perf_counter() - started)
            user_steps.append(statistics.median(own) / steps)
        after = cpu_seconds()
        used = {role: after.get(role, 0.0) - before.get(role, 0.0) for role in after}
        result[str(n)] = {
            "tokens_per_s": [n * steps * datums * length / w for w in walls],
            "step_s": user_steps,
            "cpu_share": {role: seconds / sum(used.values()) for role, seconds in used.items()},
            "cores_busy": sum(used.values()) / sum(walls),
        }
        print(f"{n} users: {statistics.median(result[str(n)]['tokens_per_s']):.0f} tok/s", file=sys.stderr, flush=True)
    for sc in clients:
        sc.close("success").result()
    return result


def child(args: argparse.Namespace) -> None:
    from server import ROOT, start_server  # sets up sys.path and the environment first

    from app.models.embedded import build_embedded_model

    path = build_embedded_model(args.preset, ROOT / "models" / args.preset)
    name = f"tinker-serve/{args.preset}"
    trainer = {"num_workers": 2, "cpus_per_worker": 1, "mixed_pass_models": args.mix_child}
    url, _ = start_server([{"name": name, "path": str(path), "trainer": trainer}])
    users = [int(n) for n in args.users.split(",")]
    result = measure(url, name, users, args.steps, args.repeats, args.datums, args.length)
    print("RESULT " + json.dumps(result), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny", choices=["tiny", "small"])
    parser.add_argument("--users", default="1,2,4,8")
    parser.add_argument("--mix", default="1,8", help="worker_group.mixed_pass_models values to compare")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--datums", type=int, default=8)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--mix-child", type=int, help=argparse.SUPPRESS)  # child mode: one server at this setting
    args = parser.parse_args()
    if args.mix_child is not None:
        child(args)
        return
    rows = results_per_setting(__file__, "--mix-child", (int(m) for m in args.mix.split(",")))
    print(f"\n{args.preset}, {args.datums}x{args.length} a step, {args.steps} steps each, medians of {args.repeats}")
    roles = ["ranks", "ingress", "trainer", "clients", "rest"]
    header = f"{'mixed_pass_models':>18} {'users':>6} {'tok/s':>8} {'vs 1 user':>10} {'step s':>8} {'vs solo':>8}"
    print(header + " cores busy " + " ".join(f"{r:>8}" for r in roles))
    throughput: dict[int, dict[str, float]] = {}
    for mix, row in rows.items():
        solo_tps, solo_step = statistics.median(row["1"]["tokens_per_s"]), statistics.median(row["1"]["step_s"])
        throughput[mix] = {}
        for n, figures in row.items():
            tps, step = statistics.median(figures["tokens_per_s"]), statistics.median(figures["step_s"])
            throughput[mix][n] = tps
            shares = " ".join(f"{figures['cpu_share'].get(r, 0.0):8.0%}" for r in roles)
            print(
                f"{mix:>18} {n:>6} {tps:8.0f} {tps / solo_tps:9.2f}x {step:8.3f} {step / solo_step:7.2f}x "
                f"{figures['cores_busy']:10.2f} {shares}"
            )
    first, *rest = throughput
    for mix in rest:
        ratios = ", ".join(f"{n} users {throughput[mix][n] / throughput[first][n]:.2f}x" for n in throughput[mix])
        print(f"throughput, mixed_pass_models {mix} / {first}: {ratios}")


if __name__ == "__main__":
    main()
