"""Sampler deployment: one per base model, autoscaled; a vLLM engine whose adapters Serve multiplexes."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from ray import serve
from ray.exceptions import RayError
from ray.serve.handle import DeploymentHandle

from app.config import ServerConfig
from app.db.futures import FutureStore
from app.db.migrate import migrate
from app.db.outcomes import Written
from app.db.schema import connect
from app.db.stability import StabilityStore
from app.db.statement_metrics import count_statements
from app.db.usage import UsageStore
from app.errors import Unavailable
from app.sampling.adapter_cache import LoadedAdapter
from app.sampling.cpu_env import replica_env
from app.sampling.engine import SamplerEngine, import_vllm
from app.sampling.openai import Answer, Route
from app.sampling.params import SampleArgs
from app.sampling.service import SamplerService
from app.storage.objects import ObjectStorage
from deployments.logs import route_app_logs, serve_log_file_kept

logger = logging.getLogger("tinker_serve.sampler")


TRAINER_START_WAIT_S = 300.0  # a trainer that takes longer (a large base loading) no longer holds vLLM back


async def _wait_for_trainer(trainer: DeploymentHandle, base_name: str) -> None:
    """Wait until `trainer` answers (Serve queues the call until its replica is up), at most TRAINER_START_WAIT_S."""
    waited = time.monotonic()
    logger.info("sampler for %s: starting vLLM once the trainer is up (they share this machine)", base_name)
    try:
        await asyncio.wait_for(trainer.ping.remote(), TRAINER_START_WAIT_S)
    except (TimeoutError, RayError) as exc:  # a slow or failed trainer must not keep sampling down
        logger.warning(
            "sampler for %s: trainer not up after %.0f s (%r); starting vLLM now",
            base_name,
            time.monotonic() - waited,
            exc,
        )
        return
    logger.info("sampler for %s: trainer up after %.1f s; starting vLLM", base_name, time.monotonic() - waited)


def start_failure(base_name: str, exc: Exception) -> Unavailable:
    """The answer to every request of a replica whose vLLM engine did not start: what vLLM said, where its log is,
    what to change."""
    said = " ".join(str(exc).split())[:2000] or repr(exc)
    return Unavailable(
        f"the sampler for {base_name} could not start vLLM: {said}. Sampling {base_name} fails until the server is "
        f"redeployed with that base model's sampler settings changed (serve_config.yaml: base_models, name "
        f"{base_name}, sampler); the Sampler replica's log (Ray's logs/serve/ on its node) has vLLM's own "
        f"messages. Training {base_name} is not affected."
    )


class Sampler:
    @classmethod
    def deployment_options(cls, config: ServerConfig, base_name: str) -> dict[str, Any]:
        sampler = config.configured_base_model(base_name).sampler
        env = {**({} if sampler.num_gpus else replica_env()), **sampler.env}
        return {
            "name": f"Sampler:{base_name}",
            "autoscaling_config": {
                "min_replicas": sampler.min_replicas,
                "max_replicas": sampler.max_replicas,
                "initial_replicas": max(1, sampler.min_replicas),
                "target_ongoing_requests": sampler.target_ongoing_requests,
                "upscale_delay_s": 5,
                "downscale_delay_s": 30,
            },
            "max_ongoing_requests": sampler.max_ongoing_requests,
            "ray_actor_options": {
                "num_cpus": sampler.num_cpus,
                "num_gpus": sampler.num_gpus,
                "resources": sampler.resources,
                "runtime_env": {"env_vars": env},
            },
            "graceful_shutdown_timeout_s": 30,
        }

    async def __init__(  # type: ignore[misc]  # Serve awaits async constructors
        self, config: dict, base_name: str, max_model_len: int, start_after: DeploymentHandle | None = None
    ) -> None:
        """`start_after`: the policy trainer, when the two share a machine's cores
        (BaseModelConfig.sampler_starts_after_trainer): vLLM starts once it answers, or after a bounded wait."""
        route_app_logs()
        started = time.monotonic()
        cfg = ServerConfig.model_validate(config)
        base = cfg.configured_base_model(base_name)
        if start_after is not None:  # vLLM's modules load meanwhile, its engine starts once the trainer answers
            await asyncio.gather(asyncio.to_thread(import_vllm), _wait_for_trainer(start_after, base_name))
        logger.info(
            "sampler for %s: starting vLLM on %s (max_loras %d, max_cpu_loras %d, context %d, tensor parallel %d)",
            base_name,
            base.path,
            base.sampler.max_loras,
            base.sampler.max_cpu_loras,
            max_model_len,
            base.sampler.tensor_parallel_size,
        )
        db = connect(cfg.db_url)
        count_statements(db, "sampler")
        await migrate(db)
        self._futures = FutureStore(db)
        self._failure: Unavailable | None = None
        replica = serve.get_replica_context().replica_id.unique_id
        work_dir = Path(cfg.state_dir) / "sampler" / replica
        try:
            with serve_log_file_kept():
                self._engine = await SamplerEngine.start(
                    base.path,
                    base.sampler.model_copy(update={"dtype": base.sampler_dtype()}),
                    max_lora_rank=cfg.engine.max_lora_rank,
                    max_model_len=max_model_len,
                    work_dir=work_dir,
                    max_images=cfg.limits.max_images_per_prompt,
                )
        except Exception as exc:  # it would fail again the same way: no restart loop, a clear answer
            self._failure = start_failure(base_name, exc)
            logger.exception("sampler for %s cannot sample: %s", base_name, self._failure.message)
            return
        self._service = SamplerService(
            base_name,
            self._engine,
            self._futures,
            StabilityStore(db),
            UsageStore(db),
            ObjectStorage(cfg.checkpoint_uri),
            cache_dir=work_dir / "adapters",
            max_cached=4 * base.sampler.max_cpu_loras,
        )

        async def register(adapter_location: str) -> LoadedAdapter:
            return await self._service.adapter(adapter_location)

        # Serve routes requests for an adapter to replicas that registered it here; vLLM's own LRU
        # (max_cpu_loras, plus the pinned zero adapter) bounds what stays loaded.
        self._register = serve.multiplexed(max_num_models_per_replica=base.sampler.max_cpu_loras - 1)(register)
        logger.info("sampler for %s ready in %.1f s", base_name, time.monotonic() - started)

    async def sample(self, request_id: str, args: SampleArgs) -> Written | None:
        """Returns the outcome once it is written to the database, for the ingress to keep (None: not written here)."""
        if self._failure is not None:
            await self._futures.fail(request_id, self._failure.to_body())
            return self._futures.recent.take(request_id)
        adapter_location = serve.get_multiplexed_model_id() or None
        await self._service.sample(request_id, args, adapter_location, register=self._register)
        return self._futures.recent.take(request_id)

    async def openai_models(self) -> dict[str, Any]:
        if self._failure is not None:
            return {"object": "list", "data": []}
        return await self._service.openai_models()

    async def openai(self, route: Route, body: dict[str, Any]) -> AsyncIterator[Answer | str]:
        """Streamed to the ingress: one (status, JSON body) answer, or the SSE lines of a streamed response."""
        if self._failure is not None:
            yield self._failure.status_code, self._failure.to_openai_body()
            return
        adapter_location = serve.get_multiplexed_model_id() or None
        answer = await self._service.openai(route, body, adapter_location, self._register)
        if isinstance(answer, tuple):
            yield answer
        else:
            async for line in answer:
                yield line

    async def ping(self) -> bool:
        """True once vLLM runs; raises what stopped it where it could not start (the replica is not ready)."""
        if self._failure is not None:
            raise self._failure
        return True

    async def start_failure(self) -> str | None:
        """Why vLLM could not start on this replica, or None."""
        return None if self._failure is None else self._failure.message

    async def check_health(self) -> None:
        """A replica whose vLLM could not start stays up (healthy), answering every request with why: Serve
        replacing it would only fail the same way, over and over."""
        if self._failure is None:
            await self._engine.check_health()

    def __del__(self) -> None:
        """Serve calls this on replica shutdown: stop vLLM's engine process with it."""
        engine = getattr(self, "_engine", None)  # none where the constructor failed before or while starting it
        if engine is not None:
            engine.shutdown()
