"""`train_loop_per_worker` of the TorchTrainer: load the base once, then serve mailbox messages forever."""

from __future__ import annotations

import logging
import os
import time
import uuid

import ray
import ray.train
import torch

from app.config import WorkerGroupConfig
from app.link.mailbox import Answer, Message, Stop
from app.models.model_config import read_model_config
from app.models.precision import resolve_dtype
from app.ranks.execute import execute_message
from app.ranks.snapshots import SnapshotWriter
from app.storage.objects import ObjectStorage
from app.training.base_model import TORCH_DTYPES, load_base_model, recompute_activations
from app.training.datum_layout import sequence_parallel_size
from app.training.engine import TrainingEngine
from app.training.sharded_load import load_sharded_base
from app.training.vision import VisionTower

logger = logging.getLogger("tinker_serve.worker")


def cap_gpu_memory(shape: WorkerGroupConfig, device: str) -> None:
    """With gpu_memory_fraction, torch's allocator on this rank's GPU holds at most that share of its memory (past
    it, after emptying its cache, an allocation fails with CUDA out of memory): a Sampler sharing the device keeps
    its gpu_memory_utilization, even when it restarts after the trainer grew."""
    if shape.use_gpu and shape.gpu_memory_fraction is not None:
        torch.cuda.set_per_process_memory_fraction(shape.gpu_memory_fraction, torch.device(device))


def command_loop(config: dict) -> None:
    """Runs on every rank. `config`: mailbox (actor handle), base_path (absolute), storage_uri, and the worker
    group's settings (app.config.WorkerGroupConfig as a dict, under "shape")."""
    from ray.train.torch import get_device  # loaded already: a TorchTrainer runs this loop

    ctx = ray.train.get_context()
    rank, world_size = ctx.get_world_rank(), ctx.get_world_size()
    shape = WorkerGroupConfig.model_validate(config["shape"])
    torch.set_num_threads(shape.torch_threads_per_worker)
    started = time.monotonic()
    device = str(get_device()) if shape.use_gpu else "cpu"
    cap_gpu_memory(shape, device)
    dtype = resolve_dtype(shape.dtype, shape.use_gpu)
    sharded = shape.shards_base()
    if sharded:  # each rank reads only its own shard of the weights
        base = load_sharded_base(config["base_path"], TORCH_DTYPES[dtype], device, shape.shard_group_size)
    else:
        base = load_base_model(config["base_path"], TORCH_DTYPES[dtype], device=device)
    if shape.recomputes_activations():
        recompute_activations(base)
    # as the Trainer sizes its operations (app.trainer.pass_sizing), which logs why when it is 1
    sequence_parallel, _ = sequence_parallel_size(
        read_model_config(config["base_path"]) or {}, shape.sequence_parallel, world_size
    )
    engine = TrainingEngine(
        base,
        rank=rank,
        world_size=world_size,
        device=device,
        micro_batch_tokens=shape.micro_batch_tokens,
        sharded=sharded,
        autocast=shape.autocast and dtype == "bfloat16",
        sequence_parallel=sequence_parallel,
        sequence_parallel_min_tokens=shape.sequence_parallel_min_tokens,
        vision=VisionTower.load(config["base_path"], TORCH_DTYPES[dtype], device),
    )
    storage = ObjectStorage(config["storage_uri"])
    snapshots = SnapshotWriter(storage)
    mailbox = config["mailbox"]
    identity = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    ray.get(mailbox.register.remote(rank, identity))
    logger.info(
        "rank %d/%d ready on %s (%s): base model %s loaded in %s%s%s%s in %.1f s",
        rank,
        world_size,
        device,
        identity,
        config["base_path"],
        dtype,
        ", loaded sharded (fsdp)" if sharded else "",
        ", recomputing activations" if shape.recomputes_activations() else "",
        f", datums over {shape.sequence_parallel_min_tokens} tokens split across {sequence_parallel} ranks"
        if sequence_parallel > 1
        else "",
        time.monotonic() - started,
    )
    answer: Answer | None = None  # the last message's (msg_id, replies), sent with the call that takes the next one
    while True:
        try:
            message: Message | Stop | None = ray.get(mailbox.next.remote(rank, 30.0, answer))
        except ray.exceptions.ActorDiedError:
            # The mailbox dies with the trainer replica that owns it. Ending the run (not failing it) lets Ray Train
            # remove the group's placement group now; a failed run would start new workers, for nobody, whose
            # placement group can outlive the run's controller.
            logger.warning("rank %d: the trainer that owns this worker group is gone; ending the run", rank)
            return
        answer = None
        if message is None:
            continue
        if isinstance(message, Stop):
            snapshots.flush()
            return
        msg_id, commands = message
        answer = (msg_id, execute_message(engine, storage, snapshots, commands))
