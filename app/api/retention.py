"""Removing checkpoints, when deleted and when expired: the row goes first (the checkpoint vanishes at once),
then its files. Every ingress replica sweeps; only the one that removes a row removes its files. Old metadata:
finished sessions' and unloaded runs' tags and user_metadata go after retention.metadata_retention_seconds."""

from __future__ import annotations

import asyncio
import time

from app.api.deps import Services
from app.storage.paths import CheckpointPath


async def remove_checkpoint(services: Services, path: CheckpointPath) -> bool:
    """Delete a checkpoint (live or expired) and its files; False when there is none."""
    record = await services.checkpoints.delete(path)
    if record is None:
        return False
    await asyncio.to_thread(services.storage.delete, record.location)
    return True


async def remove_expired_checkpoints(services: Services) -> int:
    """Remove every checkpoint past its expiry (they are already invisible); returns how many."""
    removed = 0
    for path in await services.checkpoints.expired(time.time()):
        removed += await remove_checkpoint(services, path)
    return removed


async def prune_old_metadata(services: Services) -> int:
    """Remove the tags and user_metadata of finished sessions and unloaded runs older than
    retention.metadata_retention_seconds; returns how many rows lost theirs."""
    return await services.metadata.prune_metadata(time.time() - services.config.retention.metadata_retention_seconds)
