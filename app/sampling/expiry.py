"""Expiry in sampling: ephemeral samplers (rows and adapter files) once unused past their TTL, and sample
futures still pending past the sample timeout (their sampler replica died with the ingress that sent them)."""

from __future__ import annotations

import asyncio
import time

from app.db.futures import FutureStore
from app.db.sampling_sessions import SamplingSessionStore
from app.errors import ServerError
from app.storage.objects import ObjectStorage


async def sweep_expired_samplers(store: SamplingSessionStore, storage: ObjectStorage, ttl_s: float) -> int:
    """Delete every expired ephemeral sampler; returns how many."""
    expired = await store.expired(ttl_s, time.time())
    for session in expired:
        await store.delete(session.sampling_session_id)
        if session.adapter_location:
            await asyncio.to_thread(storage.delete, session.adapter_location)
    return len(expired)


async def fail_stale_samples(futures: FutureStore, timeout_s: float) -> int:
    """Fail sample futures pending longer than `timeout_s`, so no client waits forever; returns how many."""
    error = ServerError(
        f"the sample did not finish within {timeout_s:g} s (timeouts.sample_timeout_seconds): its "
        "sampler probably restarted; send it again"
    )
    return await futures.fail_stale("sample", time.time() - timeout_s, error.to_body())
