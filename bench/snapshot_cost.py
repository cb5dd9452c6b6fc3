"""What a snapshot costs training: the trainer's step (forward_backward + optim_step) against the part of a snapshot
that holds it up (copying the model's adapter and optimizer state), and the write that runs on a thread beside it.
In process, on the engine the workers run (no Ray, no server).

    python bench/snapshot_cost.py [--preset small] [--shape 8x64] [--rank 32] [--repeats 5] [--every 10]

Prints medians of each, the copy as a fraction of one step, and the overhead per step at the default snapshot
interval (trainer.snapshot_every_steps).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import numpy as np
import torch
from server import ROOT  # sets up sys.path and the environment first

from app.messages import AdamParams, AdapterSpec
from app.models.embedded import build_embedded_model
from app.storage.objects import ObjectStorage
from app.training.base_model import load_base_model
from app.training.checkpoint import write_captured
from app.training.engine import TrainingEngine
from app.training_data.batch import PackedBatch


def batch(n: int, length: int, vocab: int) -> PackedBatch:
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, vocab, size=(n, length + 1))
    offsets = np.arange(0, n * length + 1, length, dtype=np.int64)
    return PackedBatch(
        tokens=tokens[:, :-1].reshape(-1),
        offsets=offsets,
        loss_inputs={"target_tokens": tokens[:, 1:].reshape(-1), "weights": np.ones(n * length, dtype=np.float32)},
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--shape", default="8x64", help="datums x tokens per step")
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--every", type=int, default=10, help="the snapshot interval to report the overhead at")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as a worker runs (trainer.torch_threads_per_worker)
    path = build_embedded_model(args.preset, ROOT / "models" / args.preset)
    engine = TrainingEngine(load_base_model(str(path)))
    engine.create_model("m", AdapterSpec(rank=args.rank, seed=0))
    n, length = (int(x) for x in args.shape.split("x"))
    data = batch(n, length, engine.pool.model.config.vocab_size)

    def step() -> None:
        engine.forward_backward("m", "cross_entropy", {}, data, False, None)
        engine.optim_step("m", AdamParams(learning_rate=1e-4))

    step()  # warm-up; the optimizer state exists from here on
    steps, copies, writes, size = [], [], [], 0
    with tempfile.TemporaryDirectory() as tmp:
        storage = ObjectStorage(tmp)
        for i in range(args.repeats):
            started = time.perf_counter()
            step()
            steps.append(time.perf_counter() - started)
            started = time.perf_counter()
            state = engine.capture_state("m")
            copies.append(time.perf_counter() - started)
            started = time.perf_counter()
            size = storage.write(f"m/snapshots/{i}", lambda out, state=state: write_captured(state, out))
            writes.append(time.perf_counter() - started)
    step_s, copy_s, write_s = (statistics.median(v) for v in (steps, copies, writes))
    print(f"preset {args.preset}, {args.shape} tokens, rank {args.rank}, {args.repeats} repeats (medians)")
    print(f"step (forward_backward + optim_step)  {step_s * 1e3:8.2f} ms")
    print(f"snapshot copy (holds up training)    {copy_s * 1e3:8.2f} ms = {copy_s / step_s:.3f} of a step")
    print(f"snapshot write (on a thread)         {write_s * 1e3:8.2f} ms, {size / 1e6:.1f} MB")
    print(f"overhead per step at every {args.every} steps: {copy_s / args.every / step_s:.4f} of a step")


if __name__ == "__main__":
    main()
