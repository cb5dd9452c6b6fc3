"""One long datum's forward_backward with and without sequence parallelism, in process: `--ranks` processes join a
gloo process group (as Ray Train's workers do) and each drives app.training.engine.TrainingEngine as
app.ranks.command_loop sets it up (the base loaded sharded with FSDP2, activation checkpointing, LoRA rank 8 on every
projection). No Ray, no server: the same engine `bench/serve_scale.py --sequence-parallel 1,2` runs through `serve
run`, without the Sampler's memory beside it.

    python bench/sequence_parallel.py [--model models/qwen3-0.6b] [--tokens 4096,8192] [--settings 1,2]
        [--dtype bfloat16] [--ranks 2] [--allocator tcmalloc|glibc]

Per length and setting (1: the datum runs whole on rank 0, the others join its weight gathers with one-token
passes; N: split across N ranks) it prints the step's seconds and each rank's resident memory before it and the
growth of its peak during it (VmHWM, reset through /proc/self/clear_refs), then each setting's time and largest
peak against the first setting's (ratios of the same run).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rank_allocator import add_allocator_option, use_allocator  # bench/ is the script's directory

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere: import app/, tests/

from app.messages import AdapterSpec
from app.training.base_model import recompute_activations
from app.training.engine import TrainingEngine
from app.training.sharded_load import load_sharded_base
from app.training_data.batch import PackedBatch
from tests.unit.training.sharded_ranks import run_ranks


def _gib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 2**20
    raise KeyError(field)


def one_step(
    rank: int, world: int, *, path: str, setting: int, tokens: int, dtype: str, device: str = "cpu"
) -> dict[str, float]:
    """A rank's side of one forward_backward of one `tokens`-token datum (on `cuda`: every rank on the one GPU, its
    collectives over gloo, and the rank's peak the CUDA allocator's)."""
    base = load_sharded_base(path, getattr(torch, dtype), device)
    recompute_activations(base)
    engine = TrainingEngine(
        base,
        device=device,
        rank=rank,
        world_size=world,
        sharded=True,
        sequence_parallel=setting,
        sequence_parallel_min_tokens=1024,
    )
    engine.create_model("m", AdapterSpec(rank=8, seed=0))
    ids = np.random.default_rng(0).integers(3, 2000, tokens)
    inputs = {"target_tokens": np.roll(ids, -1), "weights": np.ones(tokens, np.float32)}
    batch = PackedBatch(ids, np.array([0, tokens]), inputs)
    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated() / 2**30
        started = time.monotonic()
        engine.forward_backward("m", "cross_entropy", {}, batch, False)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() / 2**30
        return {
            "s": round(time.monotonic() - started, 1),
            "rss_gib": round(before, 2),
            "growth_gib": round(peak - before, 2),
        }
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = _gib("VmRSS")
    started = time.monotonic()
    engine.forward_backward("m", "cross_entropy", {}, batch, False)
    return {
        "s": round(time.monotonic() - started, 1),
        "rss_gib": round(before, 2),
        "growth_gib": round(_gib("VmHWM") - before, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="models/qwen3-0.6b")
    parser.add_argument("--tokens", default="4096")
    parser.add_argument("--settings", default="1,2")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cuda: every rank on the one GPU (memory per rank)")
    add_allocator_option(parser)
    args = parser.parse_args()
    use_allocator(args.allocator)
    results: dict[str, Any] = {}
    for tokens in [int(t) for t in args.tokens.split(",")]:
        settings = [int(s) for s in args.settings.split(",")]
        for setting in settings:
            ranks = run_ranks(
                one_step,
                world=args.ranks,
                timeout_s=7200,
                path=args.model,
                setting=setting,
                tokens=tokens,
                dtype=args.dtype,
                device=args.device,
            )
            results[f"{tokens} tokens, sequence_parallel {setting}"] = ranks
            print(f"{tokens} tokens, sequence_parallel {setting}: {ranks}", flush=True)
        first = results[f"{tokens} tokens, sequence_parallel {settings[0]}"]
        for setting in settings[1:]:
            other = results[f"{tokens} tokens, sequence_parallel {setting}"]
            peak = max(r["rss_gib"] + r["growth_gib"] for r in other) / max(
                r["rss_gib"] + r["growth_gib"] for r in first
            )
            print(
                f"{tokens} tokens: sequence_parallel {setting} vs {settings[0]}: "
                f"time x{other[0]['s'] / first[0]['s']:.2f}, "
                f"largest rank peak x{peak:.2f}",
                flush=True,
            )
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
