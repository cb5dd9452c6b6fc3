"""Ingress deployment: the Tinker HTTP API, dispatching to Trainer and Sampler handles."""

from __future__ import annotations

import asyncio
import logging
import time
from functools import partial
from typing import Any

from ray.serve.handle import DeploymentHandle

from app.api.auth import check_mode_fits_bind
from app.api.wiring import INGRESS_SWEEPS, build_services, ingress_app
from app.config import ServerConfig, redacted
from app.sweeps import start_sweeps, stop_sweeps
from app.training_data.validation import ModelLimits
from deployments import direct_ingress
from deployments.handles import ServeSamplerClient, ServeTrainerClient
from deployments.logs import route_app_logs
from deployments.status import ServeReplicaCounts

logger = logging.getLogger("tinker_serve.ingress")


def _proxy_host() -> str | None:
    """Where Serve's HTTP proxy binds, from the controller's HTTP options (None when they cannot be read)."""
    from ray.serve.context import _get_global_client  # no public API tells a replica its proxy's address

    try:
        client = _get_global_client(raise_if_no_controller_running=False)
        return None if client is None else str(client.http_config.host)
    except Exception:  # a Serve version without these internals: the per-request loopback check still holds
        logger.warning("could not read Serve's HTTP host; the open-mode bind check is skipped", exc_info=True)
        return None


class Ingress:
    @classmethod
    def deployment_options(cls, config: ServerConfig) -> dict[str, Any]:
        return {
            "name": "Ingress",
            "num_replicas": config.ingress_replicas,
            "ray_actor_options": {"num_cpus": 0},
            "max_ongoing_requests": 2_000,
            # a replaced replica's long-polls are cut after this (the SDK polls again; futures are in the database),
            # so its successor gets the pinned direct-ingress port soon (deployments/direct_ingress.py). Serve
            # raises it to its drain period plus 5 s under direct or HAProxy ingress.
            "graceful_shutdown_timeout_s": 5,
        }

    async def __init__(  # type: ignore[misc]  # Serve awaits async constructors
        self,
        config: dict,
        trainers: dict[str, DeploymentHandle],
        samplers: dict[str, DeploymentHandle],
        model_limits: dict[str, dict],
    ) -> None:
        route_app_logs()
        started = time.monotonic()
        await direct_ingress.prepare()
        cfg = ServerConfig.model_validate(config)
        check_mode_fits_bind(cfg.auth.mode, await asyncio.to_thread(_proxy_host))  # it asks the controller: blocks
        self._services = await build_services(
            cfg,
            partial(ServeTrainerClient, trainers),
            partial(ServeSamplerClient, samplers),
            {name: ModelLimits(**limits) for name, limits in model_limits.items()},
            replicas=ServeReplicaCounts(),
        )
        self._sweeps = start_sweeps(INGRESS_SWEEPS, self._services, cfg)
        logger.info(
            "ingress ready in %.1f s: base models %s, checkpoints in %s, auth %s",
            time.monotonic() - started,
            sorted(model_limits),
            redacted(cfg.checkpoint_uri),
            cfg.auth.mode,
        )

    def __serve_build_asgi_app__(self) -> Any:
        """Serve calls this after the constructor: the API, bound to this replica's collaborators."""
        api = ingress_app(self._services.config)
        api.state.services = self._services
        return api

    async def __del__(self) -> None:
        """Serve calls this on replica shutdown: the sweeps stop with the replica."""
        await stop_sweeps(self._sweeps)
