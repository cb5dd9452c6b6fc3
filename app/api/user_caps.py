"""What one user may keep (quotas.*_per_user): sessions, training runs and the bytes of their tags and user_metadata,
ephemeral samplers and stability records. Each is checked before the new thing is recorded and answers a user error
naming the quota and how to make room. Finished sessions and unloaded runs stop counting once their metadata is
pruned (retention.metadata_retention_seconds, app.api.retention)."""

from __future__ import annotations

import json
import time

from app.api.deps import Services
from app.db.metadata import Kept
from app.errors import LimitExceeded


def _json_bytes(*values: object) -> int:
    return sum(len(json.dumps(value)) for value in values)


async def _kept(services: Services, user: str, besides: str | None = None) -> Kept:
    kept_since = time.time() - services.config.retention.metadata_retention_seconds
    return await services.metadata.kept_by(user, kept_since, besides)


def _check_metadata_bytes(services: Services, user: str, kept: Kept, adding: int, field: str) -> None:
    limit = services.config.quotas.for_user(user).max_metadata_bytes_per_user
    if kept.metadata_bytes + adding > limit:
        raise LimitExceeded(
            f"your sessions and training runs keep {kept.metadata_bytes} bytes of tags and user_metadata; {adding} "
            f"more exceed quotas.max_metadata_bytes_per_user={limit}. Send less, or finish sessions and unload "
            "models: theirs is removed after retention.metadata_retention_seconds",
            field=field,
        )


async def check_session_room(services: Services, user: str, tags: list[str], user_metadata: dict) -> None:
    """Room for one more session of `user`'s, with these tags and metadata."""
    kept, limit = await _kept(services, user), services.config.quotas.for_user(user).max_sessions_per_user
    if kept.sessions >= limit:
        raise LimitExceeded(
            f"you keep {kept.sessions} sessions (quotas.max_sessions_per_user={limit}): finish some (close their "
            "ServiceClients); finished ones stop counting after retention.metadata_retention_seconds",
            field="session_id",
        )
    _check_metadata_bytes(services, user, kept, _json_bytes(tags, user_metadata), "user_metadata")


async def check_run_room(services: Services, user: str, model_id: str, user_metadata: dict) -> None:
    """Room for one more training run of `user`'s (`model_id`: a retry's own run is not counted)."""
    kept = await _kept(services, user, besides=model_id)
    limit = services.config.quotas.for_user(user).max_training_runs_per_user
    if kept.runs >= limit:
        raise LimitExceeded(
            f"you keep {kept.runs} training runs (quotas.max_training_runs_per_user={limit}): unload models "
            "(unload_model, or close their ServiceClients); unloaded ones stop counting after "
            "retention.metadata_retention_seconds",
            field="model_seq_id",
        )
    _check_metadata_bytes(services, user, kept, _json_bytes(user_metadata), "user_metadata")


async def check_ephemeral_room(services: Services, user: str, sampler_id: str) -> None:
    """Room for one more ephemeral sampler of `user`'s (`sampler_id`: a retry's own is not counted)."""
    limit = services.config.quotas.for_user(user).max_ephemeral_samplers_per_user
    live = await services.metadata.ephemeral_samplers_of(user, besides=sampler_id)
    if live >= limit:
        ttl = services.config.retention.ephemeral_sampler_ttl_seconds
        raise LimitExceeded(
            f"you have {live} ephemeral samplers (quotas.max_ephemeral_samplers_per_user={limit}); one expires "
            f"{ttl:g} s after its last use (retention.ephemeral_sampler_ttl_seconds), or save sampler weights "
            "under a name (counted in quotas.max_checkpoint_bytes_per_user) instead",
            field="sampling_session_seq_id",
        )


def stability_record_bytes(prompt_tokens: int, max_tokens: int, num_samples: int) -> int:
    """The most a recording sample's stability records hold (app.db.stability: 4 bytes a prompt token and 8 a
    sampled token, for each sequence)."""
    return num_samples * (4 * prompt_tokens + 8 * max_tokens)


async def check_stability_room(services: Services, user: str, nbytes: int) -> None:
    """Room for `nbytes` more of `user`'s stability records."""
    limit = services.config.quotas.for_user(user).max_stability_record_bytes_per_user
    held = await services.stability.bytes_of(user)
    if held + nbytes > limit:
        ttl = services.config.retention.stability_record_ttl_seconds
        raise LimitExceeded(
            f"your stability records hold {held} bytes; this sample's could add {nbytes} (num_samples x (4 x prompt "
            f"tokens + 8 x max_tokens)), beyond quotas.max_stability_record_bytes_per_user={limit}. Records expire "
            f"{ttl:g} s after their last use (retention.stability_record_ttl_seconds); sample fewer or shorter",
            field="record_stability_info",
        )
