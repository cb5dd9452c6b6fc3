"""Sampling: sampling sessions (from a base model or saved sampler weights) and asample."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from functools import partial

from fastapi import APIRouter

from app.api.deps import Services, ServicesDep, UserDep
from app.api.quotas import admit_sample, check_sample_tokens
from app.api.user_caps import check_stability_room, stability_record_bytes
from app.db.sampling_sessions import SamplingSession, sampling_session_id_for
from app.db.stability import sequence_ids
from app.errors import LimitExceeded, UserError
from app.images.assets import ImageAssets
from app.protocol.wire import CreateSamplingSessionRequest, JoinSamplingSessionRequest, SampleRequest
from app.request_log import log_request
from app.sampling.params import holds_images, sample_args

router = APIRouter(prefix="/api/v1")


async def adapter_of(services: Services, model_path: str, user: str, field: str = "model_path") -> tuple[str, str]:
    """(base model, adapter location) of saved sampler weights or a training checkpoint (both hold a PEFT
    adapter) that `user` may read; a user error naming `field` if there is none."""
    record, run = await services.saved_by(
        model_path,
        user,
        field=field,
        kinds=("sampler_weights", "weights"),
        hint="sample from sampler_weights (save_weights_for_sampler) or weights (save_state)",
    )
    if run.role == "critic":
        raise UserError(
            f"{field} {model_path!r} belongs to a critic, which predicts values and cannot be sampled; sample from "
            "its policy",
            field=field,
        )
    return run.base_model, record.location


@router.post("/create_sampling_session")
async def create_sampling_session(body: CreateSamplingSessionRequest, services: ServicesDep, user: UserDep) -> dict:
    if (body.base_model is None) == (body.model_path is None):
        raise UserError("send exactly one of base_model and model_path", field="base_model")
    await services.session(body.session_id, user)
    if body.model_path is not None:
        base_model, adapter_location = await adapter_of(services, body.model_path, user)
    elif body.base_model is not None:  # always, after the exactly-one check above
        base_model, adapter_location = services.served_base_model(body.base_model).name, None
    session = await services.sampler_store.create(
        SamplingSession(
            sampling_session_id=sampling_session_id_for(body.session_id, body.sampling_session_seq_id),
            session_id=body.session_id,
            base_model=base_model,
            model_path=body.model_path,
            adapter_location=adapter_location,
            ephemeral=False,
            last_used_at=time.time(),
        )
    )
    return {"sampling_session_id": session.sampling_session_id, "type": "create_sampling_session"}


@router.get("/samplers/{sampling_session_id}")
async def get_sampler(sampling_session_id: str, services: ServicesDep, user: UserDep) -> dict:
    session = await services.sampling_session(sampling_session_id, user)
    return {
        "sampler_id": session.sampling_session_id,
        "base_model": session.base_model,
        "model_path": session.model_path,
    }


@router.post("/join_sampling_session")
async def join_sampling_session(body: JoinSamplingSessionRequest, services: ServicesDep, user: UserDep) -> dict:
    """A client id unique within the sampling session (1, 2, ...; its first client is 0): an unpickled
    SamplingClient numbers its samples' seq_ids from client_counter * 1e9, so clones never collide."""
    session = await services.sampling_session(body.sampling_session_id, user)
    counter = await services.sampler_store.join(session.sampling_session_id)
    return {"type": "join_sampling_session", "client_counter": counter}


async def _check_record_room(services: Services, session_id: str, num_samples: int) -> None:
    """Refuse a sample whose stability records would take the session past its limit."""
    limit, ttl = services.config.quotas.max_stability_records_per_session, services.config.retention
    live = await services.stability.count(session_id)
    if live + num_samples > limit:
        raise LimitExceeded(
            f"session {session_id!r} holds {live} stability records; {num_samples} more exceed "
            f"quotas.max_stability_records_per_session={limit}. Records expire after "
            f"retention.stability_record_ttl_seconds={ttl.stability_record_ttl_seconds:g} s unused",
            field="record_stability_info",
        )


async def _adapter_now(services: Services, session: SamplingSession, user: str) -> str | None:
    """The adapter location to sample `session` with: its saved weights are looked up again as /v1 does on every
    request (adapter_of), so a checkpoint deleted, or unpublished by another owner, stops serving at once."""
    if session.model_path is None:  # the base model, or an ephemeral adapter (its session expires with it)
        return session.adapter_location
    _, location = await adapter_of(services, session.model_path, user)
    return location


@router.post("/asample")
async def asample(body: SampleRequest, services: ServicesDep, user: UserDep) -> dict:
    session = await services.sampling_session(body.sampling_session_id, user)
    model = services.model_limits.get(session.base_model)
    if model is None:
        raise UserError(
            f"this sampler's base model {session.base_model!r} is no longer served here", field="sampling_session_id"
        )
    adapter_location = await _adapter_now(services, session, user)
    config = services.config
    check = partial(sample_args, body, config.limits, model, ImageAssets.of(config.images, config.limits))
    args = await asyncio.to_thread(check) if holds_images(body.prompt) else check()  # images: base64, files
    args = replace(args, usage_session=session.session_id)
    check_sample_tokens(services, user, len(args.prompt) + args.num_samples * args.max_tokens)
    if body.record_stability_info:
        await _check_record_room(services, session.session_id, args.num_samples)
        nbytes = stability_record_bytes(len(args.prompt), args.max_tokens, args.num_samples)
        await check_stability_room(services, user, nbytes)
        args = replace(args, record_for_session=session.session_id)
    admit_sample(services, user, session.base_model)
    created = False
    try:
        request_id, created = await services.futures.create("sample", session.sampling_session_id, body.seq_id)
        if created:
            services.samplers.sample(session.base_model, request_id, adapter_location, args, user)
        log_request(
            "queued" if created else "retried",
            op="sample",
            sampling_session_id=session.sampling_session_id,
            seq_id=body.seq_id,
            tinker_request_id=request_id,
            num_samples=args.num_samples,
        )
    finally:
        if not created:  # a retried submit (its sample already runs) or a failed create
            services.samplers.release(session.base_model, user)
    return {"request_id": request_id, "sample_sequence_ids": sequence_ids(request_id, args.num_samples)}
