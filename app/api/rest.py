"""REST views (RestClient): training runs, their checkpoints (list, delete, publish, TTL, download links) and
describing weights. Checkpoint ids are `{kind}/{name}`, so their routes take a path parameter; the routes
with a suffix come before the bare delete, which would otherwise swallow them.

A user sees and changes their own runs and checkpoints; another user's published checkpoints can be read (download
links, weights_info, listed with `public: true`), never changed. Anything else of another user's answers as a
missing one does."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from fastapi import APIRouter, Query, Request

from app.api.checkpoints import checkpoint_expiry
from app.api.deps import OffsetQuery, Services, ServicesDep, UserDep
from app.api.downloads import signed_urls
from app.api.listing import listed_metadata, metadata_share
from app.api.retention import remove_checkpoint
from app.db.metadata import TrainingRun
from app.errors import NotFound, ServerError, UserError
from app.protocol.wire import CheckpointTtlRequest, WeightsInfoRequest
from app.storage.paths import CheckpointPath, checkpoint_path

router = APIRouter(prefix="/api/v1")


async def _run(services: Services, run_id: str, user: str) -> TrainingRun:
    try:
        return await services.training_run(run_id, user)
    except NotFound as exc:
        raise NotFound(f"training run {run_id!r} does not exist", field="run_id") from exc


async def _path(services: Services, run_id: str, checkpoint_id: str, user: str) -> CheckpointPath:
    """The checkpoint `{kind}/{name}` of a run of `user`'s; user errors naming `checkpoint_id` when malformed."""
    run = await _run(services, run_id, user)
    kind, _, name = checkpoint_id.partition("/")
    return checkpoint_path(run.model_id, kind, name, field="checkpoint_id")


def _run_view(run: TrainingRun, owner: str) -> dict:
    return {
        "training_run_id": run.model_id,
        "base_model": run.base_model,
        "model_owner": owner,
        "is_lora": True,
        "lora_rank": run.lora_rank,
        "corrupted": False,
        "last_request_time": datetime.fromtimestamp(run.created_at, UTC).isoformat(),
        "user_metadata": {k: str(v) for k, v in run.user_metadata.items()},
    }


def _listed_run(run: TrainingRun, owner: str, share: int) -> dict:
    view = _run_view(run, owner)
    return {**view, **listed_metadata(view["user_metadata"], share)}


@router.get("/training_runs")
async def training_runs(
    services: ServicesDep, user: UserDep, limit: int = Query(20, ge=1, le=1000), offset: OffsetQuery = 0
) -> dict:
    """The caller's runs, newest first; their user_metadata bounded per page (app.api.listing)."""
    runs, total = await services.metadata.list_training_runs(limit, offset, owner=user)
    share = metadata_share(services.config.limits.max_listing_metadata_bytes, runs)
    return {
        "training_runs": [_listed_run(r, user, share) for r in runs],
        "cursor": {"offset": offset, "limit": limit, "total_count": total},
    }


@router.get("/training_runs/{run_id}")
async def training_run(run_id: str, services: ServicesDep, user: UserDep) -> dict:
    """The run, with when its live model was last snapshotted (null: never; see docs/guides/durability.md)."""
    run = await _run(services, run_id, user)
    snapshots = await services.journal.snapshots_of(run.model_id)
    last = datetime.fromtimestamp(snapshots[0].created_at, UTC).isoformat() if snapshots else None
    return {**_run_view(run, user), "last_snapshot_time": last}


@router.get("/training_runs/{run_id}/history")
async def run_history(
    run_id: str,
    services: ServicesDep,
    user: UserDep,
    after_seq: int = Query(-1, ge=-1, le=2**63 - 1),
    limit: int = Query(500, ge=1, le=5000),
) -> dict:
    """The run's training steps (forward_backward, forward, optim_step) as they finished, oldest first, each with
    its metrics; paged by seq_id: pass the last point's as `after_seq` (`next_after_seq`, null at the end)."""
    run = await _run(services, run_id, user)
    points = await services.history.page(run.model_id, after_seq, limit)
    more = len(points) == limit
    return {"points": [p.to_json() for p in points], "next_after_seq": points[-1].seq_id if more else None}


@router.get("/training_runs/{run_id}/checkpoints")
async def run_checkpoints(run_id: str, services: ServicesDep, user: UserDep) -> dict:
    run = await _run(services, run_id, user)
    found = await services.checkpoints.of_run(run.model_id)
    return {"checkpoints": [c.to_json(run.base_model) for c in found], "cursor": None}


@router.get("/checkpoints")
async def user_checkpoints(
    services: ServicesDep, user: UserDep, limit: int = Query(100, ge=1, le=1000), offset: OffsetQuery = 0
) -> dict:
    """The caller's live checkpoints and every user's published ones (`public: true`), newest first."""
    found, total = await services.checkpoints.page(limit, offset, readable_by=user)
    share = metadata_share(services.config.limits.max_listing_metadata_bytes, found)
    bases = await services.checkpoints.base_models(c.path.model_id for c in found)
    return {
        "checkpoints": [
            {**c.to_json(bases.get(c.path.model_id)), **listed_metadata(c.user_metadata, share)} for c in found
        ],
        "cursor": {"offset": offset, "limit": limit, "total_count": total},
    }


@router.post("/training_runs/{run_id}/checkpoints/{checkpoint_id:path}/publish")
async def publish(run_id: str, checkpoint_id: str, services: ServicesDep, user: UserDep) -> dict:
    """Mark public (publishing twice is harmless: the SDK retries a 409 for minutes)."""
    path = await _path(services, run_id, checkpoint_id, user)
    await services.checkpoints.update(path, public=1)
    await services.audit.record("checkpoint_published", user, {"tinker_path": path.uri, "model_id": run_id})
    return {"public": True}


@router.delete("/training_runs/{run_id}/checkpoints/{checkpoint_id:path}/publish")
async def unpublish(run_id: str, checkpoint_id: str, services: ServicesDep, user: UserDep) -> dict:
    path = await _path(services, run_id, checkpoint_id, user)
    await services.checkpoints.update(path, public=0)
    await services.audit.record("checkpoint_unpublished", user, {"tinker_path": path.uri, "model_id": run_id})
    return {"public": False}


@router.put("/training_runs/{run_id}/checkpoints/{checkpoint_id:path}/ttl")
async def set_ttl(
    run_id: str, checkpoint_id: str, body: CheckpointTtlRequest, services: ServicesDep, user: UserDep
) -> dict:
    """Expire `ttl_seconds` from now; null keeps the checkpoint until deleted."""
    expires_at = checkpoint_expiry(services.config.retention, body.ttl_seconds)
    path = await _path(services, run_id, checkpoint_id, user)
    await services.checkpoints.update(path, expires_at=expires_at)
    details = {"tinker_path": path.uri, "model_id": run_id, "ttl_seconds": body.ttl_seconds}
    await services.audit.record("checkpoint_ttl_set", user, details)
    return {"expires_at": expires_at}


@router.get("/training_runs/{run_id}/checkpoints/{checkpoint_id:path}/external_weights_urls")
async def external_weights_urls(
    run_id: str, checkpoint_id: str, request: Request, services: ServicesDep, user: UserDep
) -> dict:
    record, run = await services.saved_by(f"tinker://{run_id}/{checkpoint_id}", user, field="checkpoint_id")
    if record.path.kind != "external_weights":
        raise UserError(
            f"{checkpoint_id!r} is not an export; download URLs exist for external_weights "
            "checkpoints (save_weights_external)",
            field="checkpoint_id",
        )
    try:
        files = await asyncio.to_thread(services.storage.files, record.location)
    except FileNotFoundError:
        raise ServerError(f"the files of {record.path.uri!r} are missing from storage") from None
    ttl_s, owner = services.config.retention.download_url_ttl_seconds, await services.owns(user, run.session_id)
    urls, expires = signed_urls(str(request.base_url), services.url_signing_key, record, files, ttl_s, owner=owner)
    return {"urls": urls, "expires": expires.isoformat()}


@router.delete("/training_runs/{run_id}/checkpoints/{checkpoint_id:path}")
async def delete_run_checkpoint(run_id: str, checkpoint_id: str, services: ServicesDep, user: UserDep) -> dict:
    path = await _path(services, run_id, checkpoint_id, user)
    if not await remove_checkpoint(services, path):
        raise NotFound(f"checkpoint {checkpoint_id!r} of {run_id!r} does not exist", field="checkpoint_id")
    await services.audit.record("checkpoint_deleted", user, {"tinker_path": path.uri, "model_id": run_id})
    return {"deleted": path.uri}


@router.post("/weights_info")
async def weights_info(body: WeightsInfoRequest, services: ServicesDep, user: UserDep) -> dict:
    _, run = await services.saved_by(body.tinker_path, user, field="tinker_path")
    lora = run.lora_config
    return {
        "base_model": run.base_model,
        "is_lora": True,
        "lora_rank": run.lora_rank,
        "train_unembed": False,
        "train_mlp": bool(lora.get("train_mlp", True)),
        "train_attn": bool(lora.get("train_attn", True)),
    }
