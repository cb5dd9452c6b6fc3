"""Many users, one pass, in process: N models' forward_backward + optim_step one after another, against the same N
requests as one mixed pass (TrainingEngine.forward_backward_many: each row through its own model's adapter) and N
optimizer steps, on the engine the workers run (no Ray, no server).

    python bench/mixed_step.py [--preset tiny] [--users 1,2,4,8] [--shape 8x64] [--repeats 5] [--threads 1]
    python bench/mixed_step.py --device cuda          # Qwen2.5-0.5B's shape in bfloat16, random weights (a GPU)

Prints, per N, the median round time of each way, the aggregate training tokens/s, and both against one model
alone measured in the same run (the issue's figure: N users' aggregate over one user's).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from gpu_lora_step import QWEN25_05B, build_base, packed, random_batch, synced  # puts the repo on sys.path
from transformers import Qwen2Config

from app.messages import AdamParams, AdapterSpec, ForwardBackwardArgs
from app.training.engine import TrainingEngine

ROOT = Path(__file__).resolve().parents[1]

ADAM = AdamParams(learning_rate=1e-4)


def timed(round_: Callable[[], None], repeats: int) -> float:
    """The median seconds of `round_()` over `repeats` (each waits for the GPU), after one warm-up."""
    run = synced(round_)
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def engine_for(preset: str, device: str) -> TrainingEngine:
    """The embedded `preset` in float32 on the CPU; on a GPU, Qwen2.5-0.5B's shape in bfloat16 (adapters float32)."""
    if device == "cpu":
        from app.models.embedded import build_embedded_model
        from app.training.base_model import load_base_model

        return TrainingEngine(load_base_model(str(build_embedded_model(preset, ROOT / "models" / preset))))
    return TrainingEngine(build_base(Qwen2Config(**QWEN25_05B), torch.bfloat16, device), device=device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--users", default="1,2,4,8")
    parser.add_argument("--shape", default="8x64", help="datums x tokens of each user's step")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a worker runs 1)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--profile", action="store_true", help="then the profile of one pass of the most users")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    users = [int(u) for u in args.users.split(",")]
    engine = engine_for(args.preset, args.device)
    n, length = (int(x) for x in args.shape.split("x"))
    data = packed(random_batch(n, length, engine.pool.model.config.vocab_size))
    step = ForwardBackwardArgs("cross_entropy", {}, False, data)
    for i in range(max(users)):
        engine.create_model(f"u{i}", AdapterSpec(rank=args.rank, seed=i))

    def one_after_another(k: int) -> None:
        for i in range(k):
            engine.forward_backward_many([(f"u{i}", step)])
            engine.optim_step(f"u{i}", ADAM)

    def forward_backward_pass(k: int) -> None:
        answers = engine.forward_backward_many([(f"u{i}", step) for i in range(k)])
        assert not any(isinstance(a, Exception) for a in answers), answers

    def one_pass(k: int) -> None:
        forward_backward_pass(k)
        for i in range(k):
            engine.optim_step(f"u{i}", ADAM)

    solo = timed(lambda: one_after_another(1), args.repeats)
    tokens = n * length
    shape = args.preset if args.device == "cpu" else f"Qwen2.5-0.5B shape, bf16, {torch.cuda.get_device_name()}"
    print(
        f"{shape}, {args.shape} per user, rank {args.rank}, {args.threads} thread(s), medians of "
        f"{args.repeats}; one user alone: {solo * 1e3:.1f} ms a step, {tokens / solo:,.0f} tok/s"
    )
    print(
        "| users | one after another, ms | one pass, ms | of which the pass's forward_backward, ms "
        "| aggregate tok/s, one pass | vs one user alone |"
    )
    print("|---|---|---|---|---|---|")
    for k in users:
        apart = timed(lambda: one_after_another(k), args.repeats)  # noqa: B023 - timed before the next k
        together = timed(lambda: one_pass(k), args.repeats)  # noqa: B023
        passing = timed(lambda: forward_backward_pass(k), args.repeats)  # noqa: B023
        rate = k * tokens / together
        cells = [apart * 1e3, together * 1e3, passing * 1e3]
        print(f"| {k} | " + " | ".join(f"{c:.1f}" for c in cells) + f" | {rate:,.0f} | {rate / (tokens / solo):.2f}x |")
    if args.profile:
        with torch.profiler.profile() as prof:
            synced(lambda: forward_backward_pass(max(users)))()
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25, max_name_column_width=50))


if __name__ == "__main__":
    main()
