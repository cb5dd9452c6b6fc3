"""copy_weights: a checkpoint copied, under its own kind and name, into another training run.

The destination is the run `{session_id}:train:{model_seq_id}` when the request names one (an existing run on the
same base model with the same LoRA config, or a new one made for the copy), else a new run in a new session (in
`destination_project_id`), the caller's either way. Runs made for a copy hold checkpoints only: they were never
loaded on a trainer. The files are copied (off the event loop) to a new storage location before the row is written,
so the copy is complete when visible and outlives its source. The SDK sends one X-Idempotency-Key across its
retries: a retry answers the first copy's path (keys are per user). The source is the caller's checkpoint or a
published one. Its bytes are held against the caller's checkpoint-byte quota from the check until the copy's row
counts (or the copy fails): concurrent copies cannot all pass one check.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

from fastapi import APIRouter, Request

from app.api.checkpoints import checkpoint_expiry
from app.api.deps import Services, ServicesDep, UserDep
from app.db.checkpoints import CheckpointRecord
from app.db.metadata import TrainingRun, model_id_for
from app.errors import LimitExceeded, NotFound, ServerError, UserError
from app.protocol.wire import CopyWeightsRequest
from app.storage.paths import CheckpointPath

router = APIRouter(prefix="/api/v1")
MAX_IDEMPOTENCY_KEY_CHARS = 128  # with the user id (64) and a colon, within copy_requests.idempotency_key (200)


def _shape(run: TrainingRun) -> tuple:
    """What a checkpoint must match to load into a run: base model, role and LoRA shape (not the init seed)."""
    return run.base_model, run.role, {k: v for k, v in run.lora_config.items() if k != "seed"}


async def _destination_run(services: Services, body: CopyWeightsRequest, source: TrainingRun, user: str) -> TrainingRun:
    """The run the copy goes into: the named one in a session of `user`'s (created if new), or a new one in a new
    session of theirs."""
    if (body.session_id is None) != (body.model_seq_id is None):
        missing = "model_seq_id" if body.model_seq_id is None else "session_id"
        raise UserError("send session_id and model_seq_id together (or destination_project_id)", field=missing)
    if body.session_id is not None and body.model_seq_id is not None:
        await services.session(body.session_id, user)
        model_id = model_id_for(body.session_id, body.model_seq_id)
        try:
            run = await services.metadata.get_training_run(model_id)
        except NotFound:
            pass
        else:
            if _shape(run) != _shape(source):
                raise UserError(
                    f"run {model_id!r} ({run.role} on {run.base_model}, LoRA {run.lora_config}) cannot hold a "
                    f"checkpoint of {source.model_id!r} ({source.role} on {source.base_model}, LoRA "
                    f"{source.lora_config}); name a run with the same base model and LoRA config, "
                    "or a new model_seq_id",
                    field="model_seq_id",
                )
            return run
        session_id = body.session_id
    else:
        session_id = await services.metadata.create_session(
            None, ["copy_weights"], {}, project_id=body.destination_project_id, owner=user
        )
        await services.metadata.finish_session(session_id, "copied")
        model_id = model_id_for(session_id, 0)
    run = replace(source, model_id=model_id, session_id=session_id, user_metadata={}, created_at=time.time())
    await services.metadata.add_training_run(replace(run, unloaded=True))
    return run


async def _copy(services: Services, source: CheckpointRecord, target: CheckpointRecord) -> CheckpointRecord:
    """Copy the files, then write the row (a collision found only then removes the copied files)."""
    try:
        size = await asyncio.to_thread(services.storage.copy, source.location, target.location)
    except FileNotFoundError:
        raise ServerError(f"the files of {source.path.uri!r} are missing from storage") from None
    target = replace(target, size_bytes=size, created_at=time.time())
    try:
        await services.checkpoints.commit(target, overwrite=False)
    except UserError:
        await asyncio.to_thread(services.storage.delete, target.location)
        raise _collision(target.path) from None
    return target


async def _fits(services: Services, user: str, nbytes: int, held: int) -> None:
    """Refuse a copy of `nbytes` that does not fit `user`'s checkpoint-byte quota beside their live checkpoints and
    the `held` bytes of their other copies under way on this replica."""
    limit = services.config.quotas.for_user(user).max_checkpoint_bytes_per_user
    used = await services.quotas.checkpoint_bytes(user) + held
    if used + nbytes > limit:
        raise LimitExceeded(
            f"this copy holds {nbytes} bytes and your live checkpoints (with copies under way) {used}, over "
            f"quotas.max_checkpoint_bytes_per_user={limit}: delete some (RestClient.delete_checkpoint) or let them "
            "expire first",
            field="source_path",
        )


def _collision(path: CheckpointPath) -> UserError:
    return UserError(
        f"{path.uri!r} already exists: the copy keeps its source's name; copy into another run "
        "(model_seq_id) or delete that checkpoint first",
        field="model_seq_id",
    )


@router.post("/copy_weights")
async def copy_weights(body: CopyWeightsRequest, request: Request, services: ServicesDep, user: UserDep) -> dict:
    sent_key = request.headers.get("x-idempotency-key")
    if sent_key and len(sent_key) > MAX_IDEMPOTENCY_KEY_CHARS:  # stored with the user id, in copy_requests
        raise UserError(
            f"X-Idempotency-Key is {len(sent_key)} characters, over {MAX_IDEMPOTENCY_KEY_CHARS}",
            field="x-idempotency-key",
        )
    key = f"{user}:{sent_key}" if sent_key else None
    if key and (done := await services.copies.find(key)) is not None:
        return {"tinker_path": done}
    source, source_run = await services.saved_by(
        body.source_path,
        user,
        field="source_path",
        kinds=("weights", "sampler_weights"),
        hint="copy training weights (save_state) or sampler weights (save_weights_for_sampler)",
    )
    expires_at = checkpoint_expiry(services.config.retention, body.ttl_seconds)
    nbytes = source.size_bytes
    async with services.copies.reserved(user, nbytes, lambda held: _fits(services, user, nbytes, held)):
        run = await _destination_run(services, body, source_run, user)
        path = CheckpointPath(run.model_id, source.path.kind, source.path.name)
        if await services.checkpoints.find(path) is not None:
            raise _collision(path)
        target = CheckpointRecord(path, path.new_location(), 0, 0.0, expires_at, False, dict(source.user_metadata))
        copied = await _copy(services, source, target)
    if key:
        await services.copies.remember(key, copied.path.uri)
    return {"tinker_path": copied.path.uri}
