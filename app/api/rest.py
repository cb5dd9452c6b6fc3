"""REST views (RestClient): a training run, its checkpoints, deleting one, describing weights."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone

from fastapi import APIRouter, Query

from app.api.deps import Services, ServicesDep
from app.errors import NotFound
from app.protocol.wire import WeightsInfoRequest
from app.storage import checkpoint_path, delete_checkpoint, list_all_checkpoints, list_checkpoints
from app.store.metadata import TrainingRun

router = APIRouter(prefix="/api/v1")


async def _run(services: Services, run_id: str) -> TrainingRun:
    try:
        return await services.training_run(run_id)
    except NotFound as exc:
        raise NotFound(f"training run {run_id!r} does not exist", field="run_id") from exc


def _run_view(run: TrainingRun) -> dict:
    return {
        "training_run_id": run.model_id, "base_model": run.base_model, "model_owner": run.session_id,
        "is_lora": True, "lora_rank": run.lora_rank, "corrupted": False,
        "last_request_time": datetime.fromtimestamp(run.created_at, timezone.utc).isoformat(),
        "user_metadata": {k: str(v) for k, v in run.user_metadata.items()},
    }


@router.get("/training_runs")
async def training_runs(services: ServicesDep, limit: int = Query(20, ge=1, le=1000),
                        offset: int = Query(0, ge=0)) -> dict:
    runs, total = await services.metadata.list_training_runs(limit, offset)
    return {"training_runs": [_run_view(r) for r in runs],
            "cursor": {"offset": offset, "limit": limit, "total_count": total}}


@router.get("/training_runs/{run_id}")
async def training_run(run_id: str, services: ServicesDep) -> dict:
    return _run_view(await _run(services, run_id))


@router.get("/training_runs/{run_id}/checkpoints")
async def run_checkpoints(run_id: str, services: ServicesDep) -> dict:
    run = await _run(services, run_id)
    found = await asyncio.to_thread(list_checkpoints, services.checkpoint_root, run.model_id)
    return {"checkpoints": [c.to_json() for c in found], "cursor": None}


@router.get("/checkpoints")
async def user_checkpoints(services: ServicesDep, limit: int = Query(100, ge=1, le=1000),
                           offset: int = Query(0, ge=0)) -> dict:
    """Every run's checkpoints, newest first (a scan of checkpoint storage)."""
    found = await asyncio.to_thread(list_all_checkpoints, services.checkpoint_root)
    return {"checkpoints": [c.to_json() for c in found[offset:offset + limit]],
            "cursor": {"offset": offset, "limit": limit, "total_count": len(found)}}


@router.delete("/training_runs/{run_id}/checkpoints/{checkpoint_id:path}")
async def delete_run_checkpoint(run_id: str, checkpoint_id: str, services: ServicesDep) -> dict:
    run = await _run(services, run_id)
    kind, _, name = checkpoint_id.partition("/")
    path = checkpoint_path(run.model_id, kind, name, field="checkpoint_id")
    if not await asyncio.to_thread(delete_checkpoint, services.checkpoint_root, path):
        raise NotFound(f"checkpoint {checkpoint_id!r} of {run_id!r} does not exist", field="checkpoint_id")
    return {"deleted": path.uri}


@router.post("/weights_info")
async def weights_info(body: WeightsInfoRequest, services: ServicesDep) -> dict:
    path, run = await services.saved_by(body.tinker_path, field="tinker_path")
    if not await asyncio.to_thread(path.directory(services.checkpoint_root).is_dir):
        raise NotFound(f"{body.tinker_path!r} does not exist", field="tinker_path")
    lora = run.lora_config
    return {"base_model": run.base_model, "is_lora": True, "lora_rank": run.lora_rank, "train_unembed": False,
            "train_mlp": bool(lora.get("train_mlp", True)), "train_attn": bool(lora.get("train_attn", True))}
