"""Saving and loading, all sequenced with the model's training: save_weights (save_state),
save_weights_for_sampler (named, or ephemeral for save_weights_and_get_sampling_client), save_weights_external
(an export to download), and load_weights (load_state, and creating a training client from a checkpoint)."""

from __future__ import annotations

import time
from dataclasses import replace

from fastapi import APIRouter

from app.api.deps import Services, ServicesDep, UserDep
from app.api.models import optimizer_of, register_model
from app.api.quotas import check_checkpoint_bytes
from app.api.training import sequenced
from app.api.user_caps import check_ephemeral_room
from app.config import RetentionConfig
from app.db.checkpoints import CheckpointRecord, already_exists
from app.db.metadata import TrainingRun
from app.db.sampling_sessions import SamplingSession, sampling_session_id_for
from app.errors import UserError
from app.messages import AdapterSpec, SequencedOp
from app.operations.load_checkpoint import LoadCheckpoint
from app.operations.save_checkpoint import SaveCheckpoint
from app.operations.save_for_sampler import SaveForSampler
from app.protocol import wire
from app.storage.paths import checkpoint_path

router = APIRouter(prefix="/api/v1")


def checkpoint_expiry(retention: RetentionConfig, ttl_seconds: int | None) -> float | None:
    """When a checkpoint given `ttl_seconds` expires (None: never); a user error outside the configured bounds."""
    if ttl_seconds is None:
        return None
    low, high = retention.min_checkpoint_ttl_seconds, retention.max_checkpoint_ttl_seconds
    if not low <= ttl_seconds <= high:
        raise UserError(
            f"ttl_seconds must be between {low} and {high} (retention.min/max_checkpoint_ttl_seconds), "
            f"got {ttl_seconds}; leave it out to keep the checkpoint until deleted",
            field="ttl_seconds",
        )
    return time.time() + ttl_seconds


def _user_metadata(metadata: dict | None) -> dict[str, str]:
    for key, value in (metadata or {}).items():
        if not isinstance(value, str):
            raise UserError(
                f"user_metadata values must be strings; {key!r} is {type(value).__name__}", field=f"user_metadata.{key}"
            )
    return dict(metadata or {})


async def _new_checkpoint(
    services: Services,
    user: str,
    model_id: str,
    kind: str,
    name: str,
    ttl_seconds: int | None,
    user_metadata: dict | None = None,
    overwrite: bool = False,
) -> CheckpointRecord:
    """The record of a save about to be written by `user`: their checkpoint bytes, name, TTL and metadata checked,
    and an existing checkpoint of that name refused unless `overwrite` (the trainer checks again when it commits)."""
    await check_checkpoint_bytes(services, user)
    path = checkpoint_path(model_id, kind, name)
    record = CheckpointRecord(
        path,
        path.new_location(),
        0,
        0.0,
        checkpoint_expiry(services.config.retention, ttl_seconds),
        False,
        _user_metadata(user_metadata),
    )
    if not overwrite and await services.checkpoints.find(path) is not None:
        raise already_exists(path)
    return record


@router.post("/save_weights")
async def save_weights(body: wire.SaveWeightsRequest, services: ServicesDep, user: UserDep) -> dict:
    async def build(request_id: str, _: TrainingRun) -> SequencedOp:
        record = await _new_checkpoint(
            services, user, body.model_id, "weights", body.path, body.ttl_seconds, body.user_metadata, body.overwrite
        )
        return SaveCheckpoint(request_id, record, body.overwrite)

    return await sequenced(services, user, "save_weights", body.model_id, body.seq_id, build)


def _refuse_critic(run: TrainingRun) -> None:
    if run.role == "critic":
        raise UserError(
            f"model {run.model_id!r} is a critic: critics predict values and cannot be sampled, "
            "so they have no sampler weights",
            field="model_id",
        )


@router.post("/save_weights_for_sampler")
async def save_weights_for_sampler(
    body: wire.SaveWeightsForSamplerRequest, services: ServicesDep, user: UserDep
) -> dict:
    async def build(request_id: str, run: TrainingRun) -> SequencedOp:
        _refuse_critic(run)
        if body.path is not None:
            record = await _new_checkpoint(
                services, user, body.model_id, "sampler_weights", body.path, body.ttl_seconds, body.user_metadata
            )
            return SaveCheckpoint(request_id, record)
        if body.sampling_session_seq_id is None:
            raise UserError("send a path (a name) or a sampling_session_seq_id", field="sampling_session_seq_id")
        sampler_id = sampling_session_id_for(run.session_id, body.sampling_session_seq_id)
        await check_checkpoint_bytes(services, user, field="sampling_session_seq_id")
        await check_ephemeral_room(services, user, sampler_id)
        location = f"ephemeral/{sampler_id}"
        await services.sampler_store.create(
            SamplingSession(
                sampling_session_id=sampler_id,
                session_id=run.session_id,
                base_model=run.base_model,
                model_path=None,
                adapter_location=location,
                ephemeral=True,
                last_used_at=time.time(),
            )
        )
        return SaveForSampler(request_id, sampler_id, location)

    return await sequenced(services, user, "save_weights_for_sampler", body.model_id, body.seq_id, build)


@router.post("/save_weights_external")
async def save_weights_external(body: wire.SaveWeightsExternalRequest, services: ServicesDep, user: UserDep) -> dict:
    """An export to download through external_weights_urls: a PEFT adapter directory (Hugging Face format); a
    critic's also holds its value head and spec, as its training checkpoint does."""

    async def build(request_id: str, run: TrainingRun) -> SequencedOp:
        if body.age_encryption_recipients:
            raise UserError(
                "age encryption of exports is not supported by this server; leave age_encryption_recipients out",
                field="age_encryption_recipients",
            )
        record = await _new_checkpoint(services, user, body.model_id, "external_weights", body.path, body.ttl_seconds)
        return SaveCheckpoint(request_id, record)

    return await sequenced(services, user, "save_weights_external", body.model_id, body.seq_id, build)


async def _training_checkpoint(
    services: Services, uri: str, user: str
) -> tuple[CheckpointRecord, TrainingRun, AdapterSpec]:
    """The checkpoint at `uri` (`user`'s, or published), the run that saved it and its spec; user errors naming
    `path` otherwise."""
    record, run = await services.saved_by(
        uri,
        user,
        field="path",
        kinds=("weights",),
        hint="load a training checkpoint (tinker://.../weights/...) saved with save_state",
    )
    return record, run, AdapterSpec(**run.lora_config, role=run.role)


def _load(request_id: str, record: CheckpointRecord, with_optimizer: bool) -> LoadCheckpoint:
    return LoadCheckpoint(request_id, record.path.uri, record.location, with_optimizer)


@router.post("/load_weights")
async def load_weights(body: wire.LoadWeightsRequest, services: ServicesDep, user: UserDep) -> dict:
    creates = body.session_id is not None or body.model_seq_id is not None
    if creates == (body.model_id is not None or body.seq_id is not None):
        raise UserError(
            "send session_id and model_seq_id (create a model from a checkpoint) or model_id and "
            "seq_id (load into an existing model)",
            field="model_id",
        )
    if creates:
        return await _create_from_checkpoint(body, services, user)
    if body.model_id is None or body.seq_id is None:
        raise UserError("loading into an existing model needs both model_id and seq_id", field="seq_id")

    async def build(request_id: str, run: TrainingRun) -> SequencedOp:
        record, _, _ = await _training_checkpoint(services, body.path, user)
        return _load(request_id, record, body.optimizer)

    return await sequenced(services, user, "load_weights", body.model_id, body.seq_id, build)


async def _create_from_checkpoint(body: wire.LoadWeightsRequest, services: Services, user: str) -> dict:
    if body.session_id is None or body.model_seq_id is None:
        raise UserError(
            "creating a model from a checkpoint needs both session_id and model_seq_id", field="model_seq_id"
        )
    optimizer = optimizer_of(body.optimizer_config)
    record, source, spec = await _training_checkpoint(services, body.path, user)
    if not body.optimizer:  # weights only: a fresh optimizer of the asked kind (Adam by default)
        spec = replace(spec, optimizer=optimizer or "adamw")
    elif optimizer not in (None, spec.optimizer):
        raise UserError(
            f"{body.path!r} holds {spec.optimizer} optimizer state; optimizer_config cannot override it",
            field="optimizer_config",
        )
    if body.base_model is not None and body.base_model != source.base_model:
        raise UserError(
            f"{body.path!r} was trained on {source.base_model!r}, not {body.base_model!r}", field="base_model"
        )
    base = services.served_base_model(source.base_model)
    return await register_model(
        services,
        user,
        "load_weights",
        body.session_id,
        body.model_seq_id,
        base,
        lambda: spec,
        body.user_metadata,
        lambda request_id: _load(request_id, record, body.optimizer),
    )
