"""`train_loop_per_worker` of the TorchTrainer: load the base once, then serve mailbox messages forever."""

from __future__ import annotations

import logging
import os
import time
import uuid

import ray
import ray.train
import torch

from app.storage.objects import ObjectStorage
from app.training.engine import TrainingEngine, load_base_model
from app.workers.execute import execute
from app.workers.mailbox import STOP
from app.workers.snapshots import SnapshotWriter

logger = logging.getLogger("tinker_serve.worker")


def command_loop(config: dict) -> None:
    """Runs on every rank. `config`: mailbox (actor handle), base_path (absolute), storage_uri, threads, use_gpu."""
    from ray.train.torch import get_device  # loaded already: a TorchTrainer runs this loop

    ctx = ray.train.get_context()
    rank, world_size = ctx.get_world_rank(), ctx.get_world_size()
    torch.set_num_threads(config["threads"])
    started = time.monotonic()
    device = str(get_device()) if config["use_gpu"] else "cpu"
    engine = TrainingEngine(
        load_base_model(config["base_path"], device=device), rank=rank, world_size=world_size, device=device
    )
    storage = ObjectStorage(config["storage_uri"])
    snapshots = SnapshotWriter(storage)
    mailbox = config["mailbox"]
    identity = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    ray.get(mailbox.register.remote(rank, identity))
    logger.info(
        "rank %d/%d ready on %s (%s): base model %s loaded in %.1f s",
        rank,
        world_size,
        device,
        identity,
        config["base_path"],
        time.monotonic() - started,
    )
    answer = None  # the last message's (msg_id, results), sent with the call that takes the next one
    while True:
        try:
            message = ray.get(mailbox.next.remote(rank, 30.0, answer))
        except ray.exceptions.ActorDiedError:
            # The mailbox dies with the trainer replica that owns it. Ending the run (not failing it) lets Ray Train
            # remove the group's placement group now; a failed run would start new workers, for nobody, whose
            # placement group can outlive the run's controller.
            logger.warning("rank %d: the trainer that owns this worker group is gone; ending the run", rank)
            return
        answer = None
        if message is None:
            continue
        msg_id, commands = message
        if commands == STOP:
            snapshots.flush()
            return
        answer = (msg_id, [execute(engine, storage, snapshots, cmd) for cmd in commands])
