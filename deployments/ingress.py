"""Ingress deployment: the Tinker HTTP API, dispatching to Trainer and Sampler handles."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from ray.serve.handle import DeploymentHandle

from app.api.auth import Authenticator, check_mode_fits_bind
from app.api.deps import Services
from app.api.handover import hand_over_again
from app.api.main import create_api
from app.api.openapi import install as install_openapi
from app.api.rates import RateLimiter
from app.api.retention import prune_old_metadata, remove_expired_checkpoints
from app.api.sessions import expire_silent_sessions
from app.api.tokens import TokenSigner
from app.config import ServerConfig, redacted
from app.db.audit import AuditLog
from app.db.checkpoints import CheckpointStore
from app.db.copies import CopyLog
from app.db.custom_losses import CustomLossStore
from app.db.futures import FutureStore
from app.db.history import HistoryStore
from app.db.journal import JournalStore
from app.db.keys import KeyStore
from app.db.metadata import MetadataStore
from app.db.migrate import migrate
from app.db.quotas import QuotaStore
from app.db.sampling_sessions import SamplingSessionStore
from app.db.schema import connect
from app.db.session_views import SessionViews
from app.db.settings import shared_secret
from app.db.stability import StabilityStore
from app.db.statement_metrics import count_statements
from app.db.traces import TraceStore
from app.db.usage import UsageStore
from app.metrics import LabelValues, RequestMetrics
from app.retry import RetryPolicy
from app.sampling.expiry import fail_stale_samples, sweep_expired_samplers
from app.storage.objects import ObjectStorage
from app.sweeps import sweep_forever
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
        configured_keys = cfg.auth.load_keys()  # the only replica that reads the key file; none: an error
        check_mode_fits_bind(cfg.auth.mode, await asyncio.to_thread(_proxy_host))  # it asks the controller: blocks
        db = connect(cfg.db_url)
        count_statements(db, "ingress")
        await migrate(db)
        logger.info("ingress: database %s ready in %.1f s", redacted(cfg.db_url), time.monotonic() - started)
        # Completions dispatched by this replica wake its long-polls at once; polling the row is for futures
        # that another replica (or a restarted trainer) finishes, so one replica polls rarely.
        futures = FutureStore(db, poll_interval_s=5.0 if cfg.ingress_replicas == 1 else 1.0)
        sampler_store, storage = SamplingSessionStore(db), ObjectStorage(cfg.checkpoint_uri)
        timeouts, retention, quotas = cfg.timeouts, cfg.retention, cfg.quotas
        stability, record_ttl = StabilityStore(db), retention.stability_record_ttl_seconds
        traces = TraceStore(db)
        self._services = services = Services(
            config=cfg,
            futures=futures,
            metadata=MetadataStore(db),
            checkpoints=CheckpointStore(db),
            storage=storage,
            trainers=ServeTrainerClient(trainers, futures),
            sampler_store=sampler_store,
            stability=stability,
            journal=JournalStore(db),
            history=HistoryStore(db, retention.max_history_points_per_run),
            session_views=SessionViews(db),
            traces=traces,
            usage=UsageStore(db),
            copies=CopyLog(db),
            custom_losses=CustomLossStore(db),
            samplers=ServeSamplerClient(
                samplers, futures, RetryPolicy(timeouts.sample_retries, timeouts.sample_retry_deadline_seconds)
            ),
            model_limits={name: ModelLimits(**limits) for name, limits in model_limits.items()},
            auth=Authenticator(
                cfg.auth.mode,
                configured_keys,
                KeyStore(db),
                cfg.auth.key_cache_seconds,
                AuditLog(db),
                TokenSigner.from_environment(await shared_secret(db, "jwt_signing_key")),
            ),
            audit=AuditLog(db),
            quotas=QuotaStore(db),
            request_rate=RateLimiter(quotas.requests_per_minute_per_key),
            sample_rate=RateLimiter(quotas.sample_tokens_per_minute_per_user),
            failed_auth_rate=RateLimiter(quotas.failed_auth_per_minute_per_client),
            url_signing_key=await shared_secret(db, "url_signing_key"),
            replicas=ServeReplicaCounts(),
        )
        sampler_ttl = retention.ephemeral_sampler_ttl_seconds
        self._sweepers = [
            asyncio.create_task(sweep)
            for sweep in (
                sweep_forever(
                    "expired ephemeral samplers",
                    lambda: sweep_expired_samplers(sampler_store, storage, sampler_ttl),
                    min(60.0, sampler_ttl / 4),
                ),
                # the first session sweep waits a whole timeout: clients get that long to reach a (re)started server
                sweep_forever(
                    "silent sessions",
                    lambda: expire_silent_sessions(services),
                    min(30.0, timeouts.session_timeout_seconds / 4),
                    first_delay_s=timeouts.session_timeout_seconds,
                ),
                sweep_forever(
                    "expired checkpoints",
                    lambda: remove_expired_checkpoints(services),
                    retention.checkpoint_sweep_seconds,
                ),
                sweep_forever(
                    "metadata past retention.metadata_retention_seconds",
                    lambda: prune_old_metadata(services),
                    min(3600.0, retention.metadata_retention_seconds / 4),
                ),
                sweep_forever(
                    "expired stability records",
                    lambda: stability.expire(time.time() - record_ttl),
                    min(60.0, record_ttl / 4),
                ),
                sweep_forever(
                    "trace entries beyond retention.max_trace_events_per_session",
                    lambda: traces.trim(retention.max_trace_events_per_session),
                    60.0,
                ),
                sweep_forever(
                    "finished futures past retention.future_retention_seconds",
                    lambda: futures.expire_finished(time.time() - retention.future_retention_seconds),
                    min(3600.0, retention.future_retention_seconds / 4),
                ),
                sweep_forever(
                    "audit events past retention.audit_retention_days",
                    lambda: services.audit.expire(time.time() - retention.audit_retention_days * 86400),
                    3600.0,
                ),
                sweep_forever(
                    "operations handed over again",
                    lambda: hand_over_again(services, timeouts.handover_check_seconds),
                    timeouts.handover_check_seconds,
                ),
                sweep_forever(
                    "stale sample futures",
                    lambda: fail_stale_samples(futures, timeouts.sample_timeout_seconds),
                    min(60.0, timeouts.sample_timeout_seconds / 4),
                ),
            )
        ]
        logger.info(
            "ingress ready in %.1f s: base models %s, checkpoints in %s, auth %s",
            time.monotonic() - started,
            sorted(model_limits),
            redacted(cfg.checkpoint_uri),
            cfg.auth.mode,
        )

    def __serve_build_asgi_app__(self) -> Any:
        """Serve calls this after the constructor: the API, bound to this replica's collaborators."""
        api = create_api()
        install_openapi(api, self._services.config)
        api.add_middleware(RequestMetrics, users=LabelValues.users(self._services.config.metrics))
        api.state.services = self._services
        return api
