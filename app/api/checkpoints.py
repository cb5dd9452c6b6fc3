"""Training checkpoints: save_weights (save_state) and load_weights (load_state, and creating a training
client from a checkpoint)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter

from app.api.deps import Services, ServicesDep
from app.api.models import check_optimizer_config, register_model
from app.api.training import sequenced
from app.errors import UserError
from app.protocol import wire
from app.storage import CheckpointPath, checkpoint_path
from app.store.metadata import TrainingRun
from app.trainer_service import CheckpointOp, TrainingOp
from app.training.checkpoint import read_spec
from app.training.lora import AdapterSpec
from app.workers.commands import CommandKind

router = APIRouter(prefix="/api/v1")


@router.post("/save_weights")
async def save_weights(body: wire.SaveWeightsRequest, services: ServicesDep) -> dict:
    async def build(request_id: str, _: TrainingRun) -> TrainingOp:
        target = checkpoint_path(body.model_id, "weights", body.path)
        return CheckpointOp(request_id, CommandKind.SAVE_STATE, str(target.directory(services.checkpoint_root)),
                            {"path": target.uri, "type": "save_weights"}, overwrite=body.overwrite)

    return await sequenced(services, "save_weights", body.model_id, body.seq_id, build)


async def _training_checkpoint(services: Services, uri: str) -> tuple[CheckpointPath, TrainingRun, AdapterSpec]:
    """The checkpoint at `uri`, the run that saved it and its spec; user errors naming `path` otherwise."""
    path, run = await services.saved_by(uri, field="path", kinds=("weights",), hint="load a training checkpoint "
                                        "(tinker://.../weights/...) saved with save_state")
    spec = await asyncio.to_thread(read_spec, path.directory(services.checkpoint_root))
    return path, run, spec


@router.post("/load_weights")
async def load_weights(body: wire.LoadWeightsRequest, services: ServicesDep) -> dict:
    creates = body.session_id is not None or body.model_seq_id is not None
    if creates == (body.model_id is not None or body.seq_id is not None):
        raise UserError("send session_id and model_seq_id (create a model from a checkpoint) or model_id and "
                        "seq_id (load into an existing model)", field="model_id")
    if creates:
        return await _create_from_checkpoint(body, services)
    if body.model_id is None or body.seq_id is None:
        raise UserError("loading into an existing model needs both model_id and seq_id", field="seq_id")

    async def build(request_id: str, run: TrainingRun) -> TrainingOp:
        path, _, _ = await _training_checkpoint(services, body.path)
        return CheckpointOp(request_id, CommandKind.LOAD_STATE, str(path.directory(services.checkpoint_root)),
                            {"path": path.uri, "model_id": run.model_id, "type": "load_weights"},
                            with_optimizer=body.optimizer)

    return await sequenced(services, "load_weights", body.model_id, body.seq_id, build)


async def _create_from_checkpoint(body: wire.LoadWeightsRequest, services: Services) -> dict:
    if body.session_id is None or body.model_seq_id is None:
        raise UserError("creating a model from a checkpoint needs both session_id and model_seq_id",
                        field="model_seq_id")
    check_optimizer_config(body.optimizer_config)
    path, source, spec = await _training_checkpoint(services, body.path)
    if body.base_model is not None and body.base_model != source.base_model:
        raise UserError(f"{body.path!r} was trained on {source.base_model!r}, not {body.base_model!r}",
                        field="base_model")
    base = services.served_base_model(source.base_model)
    directory = str(path.directory(services.checkpoint_root))

    def load(request_id: str, model_id: str) -> CheckpointOp:
        return CheckpointOp(request_id, CommandKind.LOAD_STATE, directory,
                            {"path": path.uri, "model_id": model_id, "type": "load_weights"},
                            with_optimizer=body.optimizer)

    return await register_model(services, "load_weights", body.session_id, body.model_seq_id, base, lambda: spec,
                                body.user_metadata, load)
