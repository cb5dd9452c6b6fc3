"""Run a function on N real processes joined in a gloo process group, as Ray Train's workers are (no Ray): the
sharded-engine tests' ranks, one group of each size for the test session. What each rank's function returns
(picklable) comes back in rank order."""

from __future__ import annotations

import gc
import os
import socket
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

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
    """`fn(rank, world, **kwargs)` on `world` ranks; their results in rank order (a rank's exception fails). The ranks
    are the session's group of that size (started on first use, kept for the next call)."""
    group = _GROUPS.get(world)
    if group is None:
        group = _GROUPS[world] = RankGroup(world)
    try:
        return group.run(fn, timeout_s, **kwargs)
    except BaseException:
        del _GROUPS[world]  # a failed rank may have left the others mid-collective: the next call starts anew
        group.close()
        raise


def close_groups() -> None:
    """Stop every rank group run_ranks started."""
    while _GROUPS:
        _GROUPS.popitem()[1].close()


class RankGroup:
    """`world` spawned processes joined in one gloo process group, kept between calls, as a trainer's ranks are: each
    spawn imports torch, transformers and the app anew (4-8 s of a 2-core machine's CPU a rank), so the modules that
    need ranks share one group per size instead of spawning their own. Each call starts from a fresh process's torch
    seed and ends with a garbage collection."""

    def __init__(self, world: int) -> None:
        ctx = mp.get_context("spawn")
        self.world = world
        self._results = ctx.Queue()
        self._tasks = [ctx.Queue() for _ in range(world)]
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self._procs = [  # daemons: killed when this process exits, should close() be missed
            ctx.Process(target=_serve_rank, args=(r, world, port, self._tasks[r], self._results), daemon=True)
            for r in range(world)
        ]
        for p in self._procs:
            p.start()

    def run(self, fn: RankFn, timeout_s: float, **kwargs: Any) -> list[Any]:
        for tasks in self._tasks:
            tasks.put((fn, kwargs))
        deadline = time.monotonic() + timeout_s
        results = dict(self._results.get(timeout=max(0.0, deadline - time.monotonic())) for _ in self._procs)
        failures = [v for v in results.values() if isinstance(v, _Failure)]
        assert not failures, failures[0].traceback
        return [results[r] for r in range(self.world)]

    def close(self) -> None:
        """Kill the ranks: they hold nothing to keep, and a rank left mid-collective by a failed one never exits."""
        for p in self._procs:
            p.kill()
            p.join()


_GROUPS: dict[int, RankGroup] = {}


class _Failure(NamedTuple):
    traceback: str


def _serve_rank(rank: int, world: int, port: int, tasks: Any, results: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    seed = torch.initial_seed()
    while True:
        fn, kwargs = tasks.get()
        torch.manual_seed(seed)
        try:
            results.put((rank, fn(rank, world, **kwargs)))
        except Exception:  # noqa: BLE001 - reported to the test
            results.put((rank, _Failure(traceback.format_exc())))
        gc.collect()


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
