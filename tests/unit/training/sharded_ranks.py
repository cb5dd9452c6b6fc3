"""Run a function on N real processes joined in a gloo process group, as Ray Train's workers are (no Ray): the
sharded-engine tests' ranks. What each rank's function returns (picklable) comes back in rank order."""

from __future__ import annotations

import os
import socket
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from app.messages import AdamParams, AdapterSpec
from app.training.base_model import load_base_model, recompute_activations
from app.training.engine import TrainingEngine
from app.training.sharded_load import load_sharded_base
from app.training_data.batch import PackedBatch

RankFn = Callable[..., Any]


def run_ranks(fn: RankFn, world: int = 2, timeout_s: float = 300, **kwargs: Any) -> list[Any]:
    """`fn(rank, world, **kwargs)` on `world` processes; their results in rank order (a rank's exception fails)."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [ctx.Process(target=_rank, args=(fn, r, world, port, queue, kwargs)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        results = dict(queue.get(timeout=timeout_s) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    failures = [v for v in results.values() if isinstance(v, str) and v.startswith("Traceback")]
    assert not failures, failures[0]
    return [results[r] for r in range(world)]


def _rank(fn: RankFn, rank: int, world: int, port: int, queue: Any, kwargs: dict[str, Any]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    try:
        queue.put((rank, fn(rank, world, **kwargs)))
    except Exception:  # noqa: BLE001 - reported to the test
        queue.put((rank, traceback.format_exc()))
    finally:
        dist.destroy_process_group()


def engine_on(
    path: Path, rank: int, world: int, *, sharding: str, micro_batch_tokens: int, shard_group_size: int | None = None
) -> TrainingEngine:
    """A rank's engine set up as app.ranks.command_loop does (activation checkpointing on)."""
    if sharding == "fsdp":
        base = load_sharded_base(str(path), torch.float32, shard_group_size=shard_group_size)
    else:
        base = load_base_model(str(path))
    recompute_activations(base)
    return TrainingEngine(
        base, rank=rank, world_size=world, micro_batch_tokens=micro_batch_tokens, sharded=sharding == "fsdp"
    )


def batch_of(lengths: list[int], seed: int, **extra: Callable[[np.random.Generator, int], np.ndarray]) -> PackedBatch:
    """Random tokens and targets of these lengths (vocabulary 2048), weights, and `extra` loss inputs."""
    rng = np.random.default_rng(seed)
    total = sum(lengths)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    inputs = {
        "target_tokens": rng.integers(3, 2048, total, dtype=np.int64),
        "weights": rng.uniform(0.5, 1.5, total).astype(np.float32),
    }
    inputs.update({name: make(rng, total) for name, make in extra.items()})
    return PackedBatch(rng.integers(3, 2048, total, dtype=np.int64), offsets, inputs)


ADAM = AdamParams(learning_rate=1e-2)
POLICY = AdapterSpec(rank=8, seed=7)
CRITIC = AdapterSpec(rank=8, seed=8, role="critic")
