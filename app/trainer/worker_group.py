"""The narrow worker-group interface and its Ray Train TorchTrainer implementation.

Safeguards from the prototype memo: every call has a timeout; a rank that re-registers (group
restart) fails in-flight messages at once; storage paths are absolute; a finished or failed `fit()`
makes `check_health` raise so Serve replaces the replica.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray

from app.allocator import preload_tcmalloc
from app.config import WorkerGroupConfig
from app.errors import ServerError
from app.link.mailbox import Mailbox
from app.link.shipping import ship
from app.messages import PingCommand, Replies, WorkerCommand

if TYPE_CHECKING:
    from ray.train.v2.api.config import ScalingConfig

logger = logging.getLogger("tinker_serve.trainer")
# How long Ray Train's controller waits for a worker group's placement group before it fails the start (default 60 s;
# a restart under memory pressure raced it). Verified in Ray 2.60 (train v2): WorkerGroup reads it from os.environ in
# the controller actor (_internal/execution/worker_group/worker_group.py), and DataParallelTrainer.fit() starts that
# actor with runtime_env env_vars holding every variable of ENV_VARS_TO_PROPAGATE set in the process calling fit(),
# this one (_internal/constants.py get_env_vars_to_propagate, api/data_parallel_trainer.py).
WORKER_GROUP_START_TIMEOUT_ENV = "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"


def scaling_config(shape: WorkerGroupConfig) -> ScalingConfig:
    """The group's Ray Train ScalingConfig: `num_workers` ranks, each reserving cpus_per_worker CPUs, its custom
    resources and, with use_gpu, gpus_per_worker of a GPU (a fraction: it shares the device)."""
    from ray.train.v2.api.config import ScalingConfig  # Ray Train: the trainer's import, not the builder's

    gpus = {"GPU": shape.gpus_per_worker} if shape.use_gpu else {}
    return ScalingConfig(
        num_workers=shape.num_workers,
        use_gpu=shape.use_gpu,
        resources_per_worker={"CPU": shape.cpus_per_worker, **gpus, **shape.resources},
    )


def worker_bundles(shape: WorkerGroupConfig) -> list[dict[str, float]]:
    """The placement group Ray Train reserves for the group before any rank starts: one bundle per rank, each the
    ScalingConfig's resources per worker (Ray 2.60, train v2: FixedScalingPolicy hands
    `_resources_per_worker_not_none` to WorkerGroup._create_placement_group)."""
    bundle = dict(scaling_config(shape)._resources_per_worker_not_none)
    return [bundle] * shape.num_workers


def rank_env(shape: WorkerGroupConfig) -> dict[str, str]:
    """The environment of each rank: tcmalloc preloaded on CPU ranks (where installed), then the configured `env`."""
    return {**({} if shape.use_gpu else preload_tcmalloc()), **shape.env}


class WorkerGroup(ABC):
    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    async def wait_ready(self) -> None:
        """Return once every rank is (again) registered: after a restart, the caller rebuilds its models before
        anything else is sent; until this returns, sends fail with GroupRestarted."""

    @abstractmethod
    def send(self, commands: Sequence[WorkerCommand]) -> Awaitable[Replies]:
        """Send `commands` to every rank now; await the result for replies[rank][command].

        Messages run on the ranks in the order they were sent."""

    async def call(self, commands: Sequence[WorkerCommand]) -> Replies:
        return await self.send(commands)

    async def pids(self) -> list[int]:
        """The process id of each rank, in rank order (each answers a ping)."""
        pids = []
        for (reply,) in await self.call([PingCommand()]):
            if not isinstance(reply, int):
                raise ServerError(f"a training worker answered a ping with {reply!r}")
            pids.append(reply)
        return pids

    @abstractmethod
    async def cancel(self, request_id: str) -> bool:
        """Turn the commands of `request_id` into no-ops if no rank has taken their message yet; whether it did."""

    async def running(self) -> tuple[str, ...]:
        """The request ids of the commands the ranks took and never answered (what they were running when they
        died), oldest first."""
        return ()

    @abstractmethod
    def check_health(self) -> None: ...

    @abstractmethod
    async def stop(self) -> None: ...

    @property
    @abstractmethod
    def world_size(self) -> int: ...


class RayTrainWorkerGroup(WorkerGroup):
    def __init__(
        self,
        name: str,
        base_path: str,
        shape: WorkerGroupConfig,
        storage_dir: str,
        *,
        checkpoint_uri: str,
        command_timeout_s: float,
        startup_timeout_s: float = 600.0,
        max_failures: int = 2,
    ) -> None:
        self._name = name
        self._base_path = base_path
        self._shape = shape
        self._storage_dir = str(Path(storage_dir).resolve())
        self._checkpoint_uri = checkpoint_uri
        self._command_timeout_s = command_timeout_s
        self._startup_timeout_s = startup_timeout_s
        self._max_failures = max_failures
        self._msg_ids = itertools.count(1)
        self._mailbox: Any = None  # the Mailbox actor's handle once started (Ray does not type actor methods)
        self._fit_thread: threading.Thread | None = None
        self._fit_error: BaseException | None = None
        self._generation = 0  # the mailbox's restart count as of the last wait_ready

    @property
    def world_size(self) -> int:
        return self._shape.num_workers

    def torch_trainer(self, mailbox: Any) -> Any:
        """The group's Ray Train TorchTrainer, its ranks taking messages from `mailbox`. Its train function is a
        reference to app.ranks.entry.run: building it loads torch (Ray Train's torch module does) but not the ranks'
        own modules, which load in the ranks."""
        # Ray Train v2 (Ray's default; ray.train re-exports these), named so that its RunConfig types
        from ray.train.torch import TorchConfig
        from ray.train.v2.api.config import FailureConfig, RunConfig
        from ray.train.v2.torch.torch_trainer import TorchTrainer

        from app.ranks.entry import run

        return TorchTrainer(
            run,
            train_loop_config={
                "mailbox": mailbox,
                "base_path": self._base_path,
                "storage_uri": self._checkpoint_uri,
                "shape": self._shape.model_dump(),
            },
            scaling_config=scaling_config(self._shape),
            torch_config=TorchConfig(backend="nccl" if self._shape.use_gpu else "gloo"),
            run_config=RunConfig(
                name=f"trainer-{uuid.uuid4().hex[:8]}",
                storage_path=self._storage_dir,
                failure_config=FailureConfig(max_failures=self._max_failures),
                worker_runtime_env={"env_vars": rank_env(self._shape)},
            ),
        )

    async def start(self) -> None:
        started = time.monotonic()
        self._fit_error = None
        self._msg_ids = itertools.count(1)  # a new mailbox queues messages from number 1 on, in order
        # ray.remote's keyword overload lists task options only; max_concurrency is an actor option
        as_actor = ray.remote(num_cpus=0, max_concurrency=10_000)  # type: ignore[call-overload]
        # named (uniquely: the previous replica's may live on a while), so an operator or a test can ask it what
        # the ranks are running
        mailbox = as_actor(Mailbox).options(name=f"mailbox-{uuid.uuid4().hex[:8]}:{self._name}")
        self._mailbox = mailbox.remote(self.world_size)
        trainer = self.torch_trainer(self._mailbox)
        os.environ[WORKER_GROUP_START_TIMEOUT_ENV] = str(self._startup_timeout_s)  # fit() hands it to Ray Train
        self._fit_thread = threading.Thread(target=self._run_fit, args=(trainer,), daemon=True, name="torchtrainer-fit")
        self._fit_thread.start()
        await self.wait_ready()
        logger.info(
            "worker group for %s ready: %d ranks in %.1f s", self._name, self.world_size, time.monotonic() - started
        )

    async def wait_ready(self) -> None:
        started = time.monotonic()
        while True:
            self.check_health()
            status = await self._mailbox.status.remote()
            if status["registered"] == self.world_size:
                break
            if time.monotonic() - started > self._startup_timeout_s:
                raise ServerError(
                    f"worker group for {self._name} did not start within "
                    f"{self._startup_timeout_s:.0f} s; check the Ray dashboard/logs for worker errors "
                    "and free CPUs/GPUs"
                )
            await asyncio.sleep(0.5)
        self._generation = status["restarts"]
        await self.pids()

    def _run_fit(self, trainer: Any) -> None:
        try:
            trainer.fit()
            self._fit_error = ServerError("the worker group's train loop ended")
        except BaseException as exc:  # surfaced through check_health
            logger.exception("worker group for %s failed", self._name)
            self._fit_error = exc

    async def running(self) -> tuple[str, ...]:
        return await self._mailbox.running.remote()

    def check_health(self) -> None:
        if self._fit_error is not None:
            raise ServerError(f"worker group for {self._name} is down: {self._fit_error!r}")

    def send(self, commands: Sequence[WorkerCommand]) -> Awaitable[Replies]:
        self.check_health()
        shipped = [ship(cmd) for cmd in commands]  # a large batch goes into the object store once, for every rank
        return self._replies(self._mailbox.call.remote(next(self._msg_ids), shipped, self._generation))

    async def _replies(self, ref: ray.ObjectRef) -> Replies:
        try:
            return await asyncio.wait_for(ref, self._command_timeout_s)
        except TimeoutError as exc:
            raise ServerError(
                f"worker group for {self._name} did not answer within "
                f"{self._command_timeout_s:.0f} s (timeouts.command_timeout_seconds)"
            ) from exc

    async def cancel(self, request_id: str) -> bool:
        return await self._mailbox.cancel.remote(request_id, PingCommand())

    async def stop(self) -> None:
        if self._mailbox is None:
            return
        await self._mailbox.stop.remote()
        if self._fit_thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._fit_thread.join, 60)
        ray.kill(self._mailbox)
        self._mailbox = None
