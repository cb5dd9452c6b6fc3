"""Per-rank peak memory and step time of the trainer's engine: replicated vs FSDP-sharded base, float32 vs bfloat16,
with activation checkpointing, at growing contexts. No Ray, no server: `--ranks` processes on this machine join a
gloo process group (as Ray Train's workers do) and drive app.training.engine.TrainingEngine in process, each the way
app.ranks.command_loop sets it up.

    python bench/memory_scale.py [--model models/qwen3-0.6b] [--shapes 8x64,2x1024,1x8192,1x32768]
        [--modes replicate,fsdp] [--dtypes float32,bfloat16] [--ranks 2] [--steps 2] [--out DIR]
        [--allocator tcmalloc|glibc]

One step is forward_backward("cross_entropy") + optim_step (AdamW), LoRA rank 32 on every projection. Per
configuration it prints each rank's resident memory once the base is loaded (and sharded), before any step ("base
RSS", measured from /proc, not computed), and per shape the median step time and each rank's peak resident memory
during the steps (VmHWM, reset after set-up through /proc/self/clear_refs). A shape DATUMSxTOKENS spreads its datums
over the ranks (a single datum runs on rank 0; with fsdp the other ranks run one-token passes to join its gathers).
A step that does not fit is reported, not retried. --out writes results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
from rank_allocator import add_allocator_option, use_allocator  # bench/ is the script's directory

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere: import app/

ROOT = Path(__file__).resolve().parents[1]


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS


def _batch(datums: int, tokens: int, vocab: int, seed: int) -> Any:
    from app.training_data.batch import PackedBatch

    rng = np.random.default_rng(seed)
    total = datums * tokens
    ids = rng.integers(3, vocab, total).astype(np.int64)
    offsets = np.arange(0, total + 1, tokens, dtype=np.int64)
    return PackedBatch(ids, offsets, {"target_tokens": np.roll(ids, -1), "weights": np.ones(total, np.float32)})


def _rank_main(
    rank: int, world: int, port: int, setup: dict, shapes: list[tuple[int, int]], steps: int, out: Any
) -> None:
    import torch
    import torch.distributed as dist

    from app.messages import AdamParams, AdapterSpec
    from app.training.base_model import TORCH_DTYPES, load_base_model, recompute_activations, shard_base
    from app.training.engine import TrainingEngine

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(setup["threads"])
    sharded = setup["mode"] == "fsdp" and world > 1
    before = _status_kib("VmRSS")
    started = time.perf_counter()
    base = load_base_model(setup["model"], TORCH_DTYPES[setup["dtype"]])
    if setup["checkpointing"]:
        recompute_activations(base)
    if sharded:
        shard_base(base, "cpu")
    engine = TrainingEngine(
        base, rank=rank, world_size=world, micro_batch_tokens=setup["micro_batch_tokens"], sharded=sharded
    )
    engine.create_model("m", AdapterSpec(rank=32, seed=0))
    dist.barrier()
    result: dict[str, Any] = {
        "rank": rank,
        "load_s": time.perf_counter() - started,
        "base_rss_mib": (_status_kib("VmRSS") - before) / 1024,
        "shapes": {},
    }
    vocab = base.config.vocab_size
    for datums, tokens in shapes:
        name = f"{datums}x{tokens}"
        batch = _batch(datums, tokens, vocab, seed=datums * tokens)
        times: list[float] = []
        _reset_peak()
        try:
            for _ in range(steps):
                dist.barrier()
                t0 = time.perf_counter()
                engine.forward_backward("m", "cross_entropy", {}, batch, False)
                engine.optim_step("m", AdamParams(learning_rate=1e-4))
                times.append(time.perf_counter() - t0)
            result["shapes"][name] = {
                "step_s": statistics.median(times),
                "steps_s": times,
                "peak_rss_gib": _status_kib("VmHWM") / 2**20,
            }
        except Exception as exc:  # noqa: BLE001 - reported: the shape does not fit
            result["shapes"][name] = {"error": "".join(traceback.format_exception_only(type(exc), exc)).strip()}
            break  # the ranks are out of step now
        print(f"  rank {rank} {setup['mode']} {setup['dtype']} {name}: {result['shapes'][name]}", flush=True)
    out.put(result)
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_setup(setup: dict, world: int, shapes: list[tuple[int, int]], steps: int) -> list[dict]:
    """Every rank's result for one configuration, in rank order (a rank that dies is reported as such)."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, world, port, setup, shapes, steps, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results: list[dict] = []
    deadline = time.monotonic() + setup["timeout_s"]
    while len(results) < world and time.monotonic() < deadline:
        try:
            results.append(queue.get(timeout=5))
        except Exception:  # noqa: BLE001 - nothing yet: go on unless a rank died (killed for memory, say)
            if any(p.exitcode not in (None, 0) for p in procs):
                break
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
    dead = [f"rank {r}: exit {p.exitcode}" for r, p in enumerate(procs) if p.exitcode not in (0, None)]
    if len(results) < world:
        return [{"rank": -1, "error": f"ranks died or hung ({', '.join(dead) or 'timeout'})", "shapes": {}}]
    return sorted(results, key=lambda r: r["rank"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(ROOT / "models" / "qwen3-0.6b"))
    parser.add_argument("--shapes", default="8x64,2x1024,1x8192,1x32768")
    parser.add_argument("--modes", default="replicate,fsdp")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--no-checkpointing", action="store_true")
    parser.add_argument("--micro-batch-tokens", type=int, default=16384)
    parser.add_argument("--timeout", type=float, default=7200.0, help="seconds one configuration may take")
    parser.add_argument("--out", type=Path)
    add_allocator_option(parser)
    args = parser.parse_args()
    use_allocator(args.allocator)
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    rows = []
    for mode in args.modes.split(","):
        for dtype in args.dtypes.split(","):
            setup = {
                "model": args.model,
                "mode": mode,
                "dtype": dtype,
                "threads": args.threads,
                "checkpointing": not args.no_checkpointing,
                "micro_batch_tokens": args.micro_batch_tokens,
                "timeout_s": args.timeout,
            }
            print(f"{mode} {dtype}: {args.ranks} ranks ...", flush=True)
            ranks = run_setup(setup, args.ranks, shapes, args.steps)  # type: ignore[arg-type]
            rows.append({"setup": setup, "ranks": ranks})
    print("\nmode       dtype     shape      step s   peak GiB per rank   (base RSS MiB per rank)")
    for row in rows:
        setup, ranks = row["setup"], row["ranks"]
        base = " / ".join(f"{r.get('base_rss_mib', float('nan')):.0f}" for r in ranks)
        for name in [f"{d}x{t}" for d, t in shapes]:
            per_rank = [r["shapes"].get(name, {}) for r in ranks]
            if any("error" in p for p in per_rank) or "error" in ranks[0]:
                why = next((p["error"] for p in per_rank if "error" in p), ranks[0].get("error", ""))
                print(f"{setup['mode']:10} {setup['dtype']:9} {name:9}  did not fit: {why[:80]}")
                continue
            if not all(per_rank):
                continue
            step = max(p["step_s"] for p in per_rank)
            peaks = " / ".join(f"{p['peak_rss_gib']:.2f}" for p in per_rank)
            print(f"{setup['mode']:10} {setup['dtype']:9} {name:9} {step:8.3f}   {peaks:18}  ({base})")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
