"""Ending sessions: a finished or silent session's models are unloaded from their trainers (what they
saved stays in storage). Every ingress replica sweeps for silent sessions; finishing twice is harmless."""

from __future__ import annotations

import logging
import time

from app.api.deps import Services
from app.db.metadata import TrainingRun

logger = logging.getLogger("tinker_serve.sessions")


async def unload(services: Services, run: TrainingRun) -> str:
    """Unload one model from its trainer; returns the unload's request id."""
    request_id, _ = await services.futures.create("unload_model", run.model_id, None)
    await services.metadata.mark_unloaded(run.model_id)
    services.trainers.unload_model(run.trainer, request_id, run.model_id)
    return request_id


async def unload_session_models(services: Services, session_id: str) -> int:
    runs = await services.metadata.loaded_runs_of(session_id)
    for run in runs:
        await unload(services, run)
    return len(runs)


async def expire_silent_sessions(services: Services) -> int:
    """Expire every session silent past timeouts.session_timeout_seconds and unload its models."""
    timeout = services.config.timeouts.session_timeout_seconds
    expired = await services.metadata.expire_sessions(time.time() - timeout)
    for session_id in expired:
        unloaded = await unload_session_models(services, session_id)
        logger.info(
            "session %s expired after %g s without a heartbeat; unloaded %d models", session_id, timeout, unloaded
        )
    return len(expired)
