"""Trainer deployment: one per trainer of a base model (policies, or critics on a group of their own), wrapping a
TrainerService and its TorchTrainer worker group."""

from __future__ import annotations

import logging
import time
from typing import Any

from app.config import ServerConfig, redacted
from app.db.checkpoints import CheckpointStore
from app.db.futures import FutureStore
from app.db.history import HistoryStore
from app.db.journal import JournalStore
from app.db.metadata import MetadataStore
from app.db.migrate import migrate
from app.db.outcomes import Written
from app.db.schema import connect
from app.db.statement_metrics import count_statements
from app.messages import SequencedOp
from app.models.model_config import read_model_config
from app.models.precision import DTYPE_BYTES, resolve_dtype
from app.operations.create_model import CreateModel
from app.storage.objects import ObjectStorage
from app.trainer.pass_sizing import PassSizing
from app.trainer.service import TrainerDeps, TrainerService
from app.trainer.worker_group import RayTrainWorkerGroup, worker_bundles
from deployments.logs import route_app_logs

logger = logging.getLogger("tinker_serve.trainer")


class Trainer:
    @classmethod
    def deployment_options(cls, config: ServerConfig, trainer: str) -> dict[str, Any]:
        return {
            "name": f"Trainer:{trainer}",
            "num_replicas": 1,
            "ray_actor_options": {"num_cpus": 0},
            "max_ongoing_requests": 100_000,  # submits wait in per-model queues, never in Serve
            "health_check_timeout_s": 30,
            "graceful_shutdown_timeout_s": 60,
        }

    async def __init__(  # type: ignore[misc]  # Serve awaits async constructors
        self, config: dict, base_name: str, trainer: str
    ) -> None:
        route_app_logs()
        started = time.monotonic()
        cfg = ServerConfig.model_validate(config)
        base = cfg.configured_base_model(base_name)
        shape = base.trainer_groups()[trainer]
        logger.info(
            "trainer %s: starting %d workers (each reserving %s in Ray%s) on %s; checkpoints in %s",
            trainer,
            shape.num_workers,
            worker_bundles(shape)[0],
            f", torch holding at most {shape.gpu_memory_fraction:g} of its GPU's memory"
            if shape.gpu_memory_fraction is not None
            else "",
            base.path,
            redacted(cfg.checkpoint_uri),
        )
        db = connect(cfg.db_url)
        count_statements(db, "trainer")
        await migrate(db)
        group = RayTrainWorkerGroup(
            trainer,
            base.path,
            shape,
            f"{cfg.state_dir}/ray_train",
            checkpoint_uri=cfg.checkpoint_uri,
            command_timeout_s=cfg.timeouts.command_timeout_seconds,
            startup_timeout_s=cfg.timeouts.worker_start_timeout_seconds,
        )
        dtype_bytes = DTYPE_BYTES[resolve_dtype(shape.dtype, shape.use_gpu)]  # as the workers resolve it
        sizing = PassSizing.of(shape, group.world_size, read_model_config(base.path), dtype_bytes)
        if sizing.unsplit:
            logger.warning("trainer %s: datums run whole on one rank each: %s", trainer, sizing.unsplit)
        self._futures = FutureStore(db)
        deps = TrainerDeps(
            group,
            self._futures,
            MetadataStore(db),
            CheckpointStore(db),
            ObjectStorage(cfg.checkpoint_uri),
            JournalStore(db),
            HistoryStore(db, cfg.retention.max_history_points_per_run),
            cfg.timeouts,
            cfg.engine,
            shape,
            sizing,
            cfg.metrics,
        )
        self._service = TrainerService(trainer, deps)
        await self._service.start()
        logger.info("trainer %s ready in %.1f s", trainer, time.monotonic() - started)

    async def create_model(self, model_id: str, create: CreateModel) -> Written | None:
        """Returns, like submit, the outcome written (after it is in the database)."""
        await self._service.create_model(model_id, create)
        return self._futures.recent.take(create.request_id)

    async def submit(self, model_id: str, seq_id: int, op: SequencedOp, user: str = "") -> Written | None:
        """Returns once the op's future is written, with what was written here for the ingress to keep (None:
        another call or the ingress wrote it, e.g. a cancel or a Skip; the ingress reads the row then)."""
        await self._service.submit(model_id, seq_id, op, user)
        return self._futures.recent.take(op.request_id)

    async def unload_model(self, request_id: str, model_id: str) -> None:
        await self._service.unload_model(request_id, model_id)

    async def cancel(self, model_id: str, seq_id: int, request_id: str) -> None:
        await self._service.cancel(model_id, seq_id, request_id)

    async def missing(self, model_id: str, seq_ids: list[int]) -> list[int]:
        return self._service.missing(model_id, seq_ids)

    async def ping(self) -> bool:
        return True

    async def worker_pids(self) -> list[int]:
        return await self._service.worker_pids()

    async def check_health(self) -> None:
        await self._service.check_health()

    async def __del__(self) -> None:
        """Serve calls this on replica shutdown. Ending the run releases its placement group; if the replica
        dies instead, Ray Train's cleaner does that, which needs Ray's state API (the dashboard)."""
        await self._service.stop()
