"""The ingress's wiring, without Serve: its `Services` over the configured database and checkpoint storage, the app
that serves them, and the table of its background sweeps. deployments/ingress.py runs these in a replica; the unit
tests' in-process API (tests/unit/api/conftest.py) runs the same."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from fastapi import FastAPI

from app.api.auth import Authenticator
from app.api.backends import ReplicaCounts, SamplerClient, TrainerClient
from app.api.deps import Services
from app.api.handover import hand_over_again
from app.api.main import create_api
from app.api.openapi import install as install_openapi
from app.api.rates import RateLimiter
from app.api.retention import prune_old_metadata, remove_expired_checkpoints
from app.api.sessions import expire_silent_sessions
from app.api.tokens import TokenSigner
from app.api.uploads import expire_uploads
from app.config import ServerConfig, redacted
from app.db.audit import AuditLog
from app.db.checkpoint_search import CheckpointSearch
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
from app.db.uploads import UploadStore
from app.db.usage import UsageStore
from app.metrics import LabelValues, RequestMetrics
from app.retry import RetryPolicy
from app.sampling.expiry import fail_stale_samples, sweep_expired_samplers
from app.storage.objects import ObjectStorage
from app.sweeps import Period, Sweep
from app.training_data.validation import ModelLimits

logger = logging.getLogger("tinker_serve.ingress")


async def build_services(
    config: ServerConfig,
    trainers: Callable[[FutureStore], TrainerClient],
    samplers: Callable[[FutureStore, RetryPolicy], SamplerClient],
    model_limits: dict[str, ModelLimits],
    *,
    replicas: ReplicaCounts | None = None,
    future_poll_s: float | None = None,
) -> Services:
    """Every collaborator of the routers, over the database at `config.db_url` (brought to this release's schema)
    and the checkpoint storage at `config.checkpoint_uri`. `trainers` and `samplers` make the clients of the
    Trainer and Sampler deployments over the future store. `future_poll_s`: how often a long-poll reads its future's
    row again; by default rarely with one replica (completions it dispatched wake its long-polls at once: the row
    is read for futures that another replica, or a restarted trainer, finishes)."""
    started = time.monotonic()
    keys = await asyncio.to_thread(config.auth.load_keys)  # api_keys mode with no key: an error, before the database
    db = connect(config.db_url)
    count_statements(db, "ingress")
    await migrate(db)
    logger.info("ingress: database %s ready in %.1f s", redacted(config.db_url), time.monotonic() - started)
    if future_poll_s is None:
        future_poll_s = 5.0 if config.ingress_replicas == 1 else 1.0
    futures, audit = FutureStore(db, poll_interval_s=future_poll_s), AuditLog(db)
    timeouts, retention, quotas, auth = config.timeouts, config.retention, config.quotas, config.auth
    signer = TokenSigner.from_environment(await shared_secret(db, "jwt_signing_key"))
    return Services(
        config=config,
        futures=futures,
        metadata=MetadataStore(db),
        checkpoints=CheckpointStore(db),
        checkpoint_search=CheckpointSearch(db),
        storage=ObjectStorage(config.checkpoint_uri),
        trainers=trainers(futures),
        sampler_store=SamplingSessionStore(db),
        stability=StabilityStore(db),
        journal=JournalStore(db),
        history=HistoryStore(db, retention.max_history_points_per_run),
        session_views=SessionViews(db),
        traces=TraceStore(db),
        usage=UsageStore(db),
        copies=CopyLog(db),
        uploads=UploadStore(db),
        custom_losses=CustomLossStore(db),
        samplers=samplers(futures, RetryPolicy(timeouts.sample_retries, timeouts.sample_retry_deadline_seconds)),
        model_limits=model_limits,
        auth=Authenticator(auth.mode, keys, KeyStore(db), auth.key_cache_seconds, audit, signer),
        audit=audit,
        quotas=QuotaStore(db),
        request_rate=RateLimiter(quotas.requests_per_minute_per_key),
        sample_rate=RateLimiter(quotas.sample_tokens_per_minute_per_user),
        failed_auth_rate=RateLimiter(quotas.failed_auth_per_minute_per_client),
        url_signing_key=await shared_secret(db, "url_signing_key"),
        replicas=replicas,
    )


def ingress_app(config: ServerConfig) -> FastAPI:
    """The API: every route, the OpenAPI document, the request metrics; the owner sets `app.state.services` (made
    by `build_services`) before serving."""
    api = create_api()
    install_openapi(api, config)
    api.add_middleware(RequestMetrics, users=LabelValues.users(config.metrics))
    return api


async def _expired_samplers(services: Services) -> int:
    ttl_s = services.config.retention.ephemeral_sampler_ttl_seconds
    return await sweep_expired_samplers(services.sampler_store, services.storage, ttl_s)


async def _stability_records(services: Services) -> int:
    return await services.stability.expire(time.time() - services.config.retention.stability_record_ttl_seconds)


async def _trace_entries(services: Services) -> int:
    return await services.traces.trim(services.config.retention.max_trace_events_per_session)


async def _finished_futures(services: Services) -> int:
    return await services.futures.expire_finished(time.time() - services.config.retention.future_retention_seconds)


async def _audit_events(services: Services) -> int:
    return await services.audit.expire(time.time() - services.config.retention.audit_retention_days * 86400)


async def _handed_over_again(services: Services) -> int:
    return await hand_over_again(services, services.config.timeouts.handover_check_seconds)


async def _stale_samples(services: Services) -> int:
    return await fail_stale_samples(services.futures, services.config.timeouts.sample_timeout_seconds)


# Every ingress replica runs each of these (deployments/ingress.py starts them with the replica, stops them with it).
INGRESS_SWEEPS: tuple[Sweep[Services], ...] = (
    Sweep(
        "expired ephemeral samplers",
        Period("retention.ephemeral_sampler_ttl_seconds", divided_by=4, cap_s=60.0),
        _expired_samplers,
    ),
    # the first session sweep waits a whole timeout: clients get that long to reach a (re)started server
    Sweep(
        "silent sessions",
        Period("timeouts.session_timeout_seconds", divided_by=4, cap_s=30.0),
        expire_silent_sessions,
        first_after=Period("timeouts.session_timeout_seconds"),
    ),
    Sweep("expired checkpoints", Period("retention.checkpoint_sweep_seconds"), remove_expired_checkpoints),
    Sweep("expired uploads", Period("uploads.sweep_seconds"), expire_uploads),
    Sweep(
        "metadata past retention.metadata_retention_seconds",
        Period("retention.metadata_retention_seconds", divided_by=4, cap_s=3600.0),
        prune_old_metadata,
    ),
    Sweep(
        "expired stability records",
        Period("retention.stability_record_ttl_seconds", divided_by=4, cap_s=60.0),
        _stability_records,
    ),
    Sweep("trace entries beyond retention.max_trace_events_per_session", Period(cap_s=60.0), _trace_entries),
    Sweep(
        "finished futures past retention.future_retention_seconds",
        Period("retention.future_retention_seconds", divided_by=4, cap_s=3600.0),
        _finished_futures,
    ),
    Sweep("audit events past retention.audit_retention_days", Period(cap_s=3600.0), _audit_events),
    Sweep("operations handed over again", Period("timeouts.handover_check_seconds"), _handed_over_again),
    Sweep(
        "stale sample futures",
        Period("timeouts.sample_timeout_seconds", divided_by=4, cap_s=60.0),
        _stale_samples,
    ),
)
