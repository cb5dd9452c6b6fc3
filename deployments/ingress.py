"""Ingress deployment: the Tinker HTTP API, dispatching training work to Trainer handles."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable

from ray.serve.handle import DeploymentHandle, DeploymentResponse

from app.api.deps import Services
from app.api.dispatch import TrainerDispatcher
from app.api.main import create_api
from app.config import ServerConfig
from app.errors import ServerError, UserError
from app.store.db import create_tables, make_engine
from app.store.futures import FutureStore
from app.store.metadata import MetadataStore
from app.trainer_service import TrainingOp
from app.training.lora import AdapterSpec
from app.training.validation import ModelLimits

logger = logging.getLogger("tinker_serve.ingress")


class ServeTrainerDispatcher(TrainerDispatcher):
    """Calls Trainer handles without waiting; when a call ends, local long-polls wake at once."""

    def __init__(self, handles: dict[str, DeploymentHandle], futures: FutureStore) -> None:
        self._handles = handles
        self._futures = futures
        self._tasks: set[asyncio.Task] = set()

    def create_model(self, base_model: str, request_id: str, model_id: str, spec: AdapterSpec) -> None:
        self._track(request_id, self._handle(base_model).create_model.remote(request_id, model_id, spec))

    def submit(self, base_model: str, model_id: str, seq_id: int, op: TrainingOp) -> None:
        self._track(op.request_id, self._handle(base_model).submit.remote(model_id, seq_id, op))

    def unload_model(self, base_model: str, request_id: str, model_id: str) -> None:
        self._track(request_id, self._handle(base_model).unload_model.remote(request_id, model_id))

    def _handle(self, base_model: str) -> DeploymentHandle:
        handle = self._handles.get(base_model)
        if handle is None:  # a run recorded by an earlier configuration
            raise UserError(f"this model's base model {base_model!r} is no longer served here; "
                            f"served: {sorted(self._handles)}", field="model_id")
        return handle

    async def ready(self) -> dict[str, bool]:
        async def ping(handle: DeploymentHandle) -> bool:
            try:
                return await asyncio.wait_for(handle.ping.remote(), 5)
            except Exception:  # noqa: BLE001 - not ready is the answer
                return False

        names = list(self._handles)
        return dict(zip(names, await asyncio.gather(*(ping(self._handles[n]) for n in names))))

    def _track(self, request_id: str, response: DeploymentResponse) -> None:
        task = asyncio.create_task(self._settle(request_id, response))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _settle(self, request_id: str, response: Awaitable[Any]) -> None:
        try:
            await response
        except Exception as exc:  # noqa: BLE001 - the trainer died or refused; the future must not hang
            logger.exception("trainer call for %s failed", request_id)
            await self._futures.fail_if_pending(request_id, ServerError(f"trainer call failed: {exc!r}").to_body())
        self._futures.notify(request_id)


class Ingress:
    @classmethod
    def deployment_options(cls, config: ServerConfig) -> dict[str, Any]:
        return {"name": "Ingress", "num_replicas": config.ingress_replicas, "ray_actor_options": {"num_cpus": 0},
                "max_ongoing_requests": 2_000}

    async def __init__(self, config: dict, trainers: dict[str, DeploymentHandle], model_limits: dict[str, dict]) -> None:
        cfg = ServerConfig.model_validate(config)
        engine = make_engine(cfg.db_url)
        await create_tables(engine)
        futures = FutureStore(engine)
        self._services = Services(
            config=cfg, futures=futures, metadata=MetadataStore(engine),
            trainers=ServeTrainerDispatcher(trainers, futures),
            model_limits={name: ModelLimits(**limits) for name, limits in model_limits.items()},
            api_keys=cfg.auth.load_keys(),
        )

    def __serve_build_asgi_app__(self) -> Any:
        """Serve calls this after the constructor: the API, bound to this replica's collaborators."""
        api = create_api()
        api.state.services = self._services
        return api
