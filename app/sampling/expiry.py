"""Expiry of ephemeral samplers: their session rows and adapter directories go once unused past the TTL."""

from __future__ import annotations

import asyncio
import logging
import shutil
import time

from app.store.samplers import SamplerStore

logger = logging.getLogger("tinker_serve.sampling")


async def sweep_expired_samplers(store: SamplerStore, ttl_s: float) -> int:
    """Delete every expired ephemeral sampler; returns how many."""
    expired = await store.expired(ttl_s, time.time())
    for session in expired:
        await store.delete(session.sampling_session_id)
        if session.adapter_dir:
            await asyncio.to_thread(shutil.rmtree, session.adapter_dir, ignore_errors=True)
    if expired:
        logger.info("expired %d ephemeral samplers unused for %g s", len(expired), ttl_s)
    return len(expired)


async def sweep_forever(store: SamplerStore, ttl_s: float) -> None:
    """Sweep every ttl/4 (at most every minute) until cancelled; a failed sweep is logged and retried."""
    interval = min(60.0, ttl_s / 4)
    while True:
        await asyncio.sleep(interval)
        try:
            await sweep_expired_samplers(store, ttl_s)
        except Exception:  # noqa: BLE001 - the next sweep retries
            logger.exception("sweeping expired samplers failed")
