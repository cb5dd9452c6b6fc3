"""Sequenced training operations: forward / forward_backward (protobuf, or JSON) and optim_step (the saves and
loads, sequenced too, are in app.api.checkpoints).

Every request that carries a seq_id gets a future, even when it is invalid: its future fails with a
user error and the trainer is told to skip that seq_id, so the model's order never stalls on a gap.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TypeVar

from fastapi import APIRouter, Request
from pydantic import BaseModel, ValidationError

from app.api.decoding import decoders as decoders_of
from app.api.deps import Services, ServicesDep, UserDep
from app.api.error_responses import validation_message
from app.api.quotas import pending_admission
from app.db import journal_codec
from app.db.metadata import TrainingRun
from app.db.outcomes import Pending
from app.errors import ServerError, TinkerServeError, UserError
from app.images.assets import ImageAssets
from app.messages import AdamParams, DimuonParams, ForwardBackwardArgs, SequencedOp, Skip
from app.operations import operation
from app.operations.forward_backward import ForwardBackward
from app.operations.optim_step import OptimStep
from app.protocol import wire
from app.protocol.codec import Bounds, decompress, is_json, valid_sequence
from app.protocol.skeleton import read_header
from app.request_log import log_request, outcome_of
from app.training_data.custom_losses import CustomLossProgram
from app.training_data.losses import CUSTOM, get_loss
from app.training_data.provenance import behaviour_inputs, referenced_sequences
from app.training_data.validation import validate_forward_backward

logger = logging.getLogger("tinker_serve.api")
router = APIRouter(prefix="/api/v1")
_P = TypeVar("_P", bound=BaseModel)
OpBuilder = Callable[[str, TrainingRun], Awaitable[SequencedOp]]  # (request_id, run) -> the operation


async def sequenced(
    services: Services,
    user: str,
    kind: str,
    model_id: str,
    seq_id: int,
    build_op: OpBuilder,
    nbytes: int = 0,
) -> dict:
    """Create (or find, for a retry) the future of (model_id, seq_id) of `user`'s model and queue its operation,
    which holds `nbytes` of training data until it runs.

    A retry whose future is still pending does the hand-over again: the first attempt may have died (its ingress
    replica killed) after creating the future and before the journal or the trainer had the operation. Each
    step is idempotent: the journal keeps its first entry, usage is counted with the entry, and the trainer
    ignores an operation it already holds."""
    run = await services.training_run(model_id, user)
    async with pending_admission(services, user, model_id, seq_id, nbytes):
        return await _queue(services, user, run, kind, seq_id, build_op)


async def _queue(services: Services, user: str, run: TrainingRun, kind: str, seq_id: int, build_op: OpBuilder) -> dict:
    """`sequenced`'s work once the operation is admitted: its future, journal row, usage and hand-over."""
    model_id = run.model_id
    request_id, created = await services.futures.create(kind, model_id, seq_id)
    if not created and not isinstance(await services.futures.get(request_id), Pending):
        log_request("retried", op=kind, model_id=model_id, seq_id=seq_id, tinker_request_id=request_id)
        return {"request_id": request_id, "model_id": model_id}
    try:
        op, encoded, error = await _build_or_skip(build_op, request_id, run)
        if error is not None:
            await services.futures.fail(request_id, error)
        log_request(
            ("queued" if created else "queued again") if error is None else "rejected",
            op=kind,
            model_id=model_id,
            seq_id=seq_id,
            tinker_request_id=request_id,
            trainer=run.trainer,
            outcome=outcome_of(error),
        )
        if created:  # one commit: the journal before the trainer has it (a restart reruns it), and usage
            appended = services.journal.append(model_id, seq_id, op, encoded)
            await asyncio.gather(appended, _count_usage(services, run, op))
        elif await services.journal.append(model_id, seq_id, op, encoded):
            await _count_usage(services, run, op)
        services.trainers.submit(run.trainer, model_id, seq_id, op, user)
    except BaseException as exc:  # the future must not stay pending: a retry would find it and wait forever
        failure = exc if isinstance(exc, TinkerServeError) else ServerError(f"{kind} was not queued: {exc!r}")
        await asyncio.shield(services.futures.fail_if_pending(request_id, failure.to_body()))
        raise
    return {"request_id": request_id, "model_id": model_id}


@router.post("/forward_backward")
async def forward_backward(request: Request, services: ServicesDep, user: UserDep) -> dict:
    """Decoded in this order: the body decompressed and (protobuf) its model_id and seq_id read, the model's owner
    checked, then the rest decoded off the event loop (app.api.decoding); every count bounded before it is built."""
    body = await request.body()
    ctype, encoding = request.headers.get("content-type", ""), request.headers.get("content-encoding")
    config = services.config
    bounds, json_body = Bounds.of(config.limits, ImageAssets.of(config.images, config.limits)), is_json(ctype)
    decoders = decoders_of(services.config.quotas)
    async with decoders.turn(user, services.config.quotas.for_user(user).max_concurrent_decodes_per_user):
        plain, header = await asyncio.to_thread(_open, body, encoding, bounds.max_body_bytes, json_body)
        if header is not None and header[0]:
            await services.training_run(header[0], user)  # another user's model answers as missing, unread
        outcome = await decoders.decode(plain, json_body, bounds)
    decoded = outcome.decoded
    if decoded is None:
        sequence = valid_sequence(*header) if header is not None else outcome.sequence
        if sequence is None or outcome.error is None:
            raise outcome.error or ServerError("the body was neither decoded nor refused")
        rejection = outcome.error

        async def reject(_: str, __: TrainingRun) -> SequencedOp:
            raise rejection

        return await sequenced(services, user, "forward_backward", *sequence, reject)

    async def build(request_id: str, run: TrainingRun) -> SequencedOp:
        custom = await _custom_loss(services, run, decoded.loss_fn_config) if decoded.loss_fn == CUSTOM else None
        loss = validate_forward_backward(
            decoded, services.config.limits, services.model_limits[run.base_model], run.role, custom
        )
        batch = decoded.batch
        if get_loss(loss.name).needs_provenance:  # the sampler's logprobs, from the records the spans name
            wanted, most = referenced_sequences(decoded), services.config.limits.max_distinct_sequence_ids_per_request
            records = await services.stability.get(run.session_id, wanted, most)
            server_side = behaviour_inputs(decoded, records)
            user_side = {k: v for k, v in batch.loss_inputs.items() if k != "logprobs"}  # not used: records rule
            batch = replace(batch, loss_inputs={**user_side, **server_side})
        args = ForwardBackwardArgs(loss.name, loss.config, decoded.forward_only, batch, custom)
        return ForwardBackward(request_id, args)

    nbytes = decoded.batch.nbytes
    return await sequenced(services, user, "forward_backward", decoded.model_id, decoded.seq_id, build, nbytes)


def _open(
    body: bytes, encoding: str | None, max_body_bytes: int, json_body: bool
) -> tuple[bytes, tuple[str, int] | None]:
    """The decompressed body and, for protobuf, its (model_id, seq_id) as sent (JSON's come with its decode)."""
    plain = decompress(body, encoding, max_body_bytes)
    return plain, None if json_body else read_header(plain)


async def _build_or_skip(
    build_op: OpBuilder, request_id: str, run: TrainingRun
) -> tuple[SequencedOp, bytes, dict | None]:
    """The operation and its journal entry (encoded off the event loop: a batch's is as large as its body), or, when
    it cannot be built or journaled, a Skip (the model's later seq_ids must not wait for it) and the error its
    future fails with: a user error as it is, anything else as a server error naming it."""
    try:
        op = await build_op(request_id, run)
        return op, await asyncio.to_thread(journal_codec.encode, op), None
    except TinkerServeError as exc:
        error = exc.to_body()
    except Exception as exc:
        logger.exception("building %s failed", request_id)
        error = ServerError(f"the request could not be prepared: {exc!r}").to_body()
    skip = Skip(request_id)
    return skip, journal_codec.encode(skip), error


async def _count_usage(services: Services, run: TrainingRun, op: SequencedOp) -> None:
    """The tokens the operation counts as the session's training usage (its operation's `usage_tokens`)."""
    tokens = operation(op).usage_tokens(op)
    if tokens:
        await services.usage.record(run.session_id, run.base_model, {"training": tokens})


def _params(model: type[_P], raw: dict, name: str) -> _P:
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        message, field = validation_message(exc.errors())
        raise UserError(f"{name}.{message}", field=f"{name}.{field}") from exc


async def _custom_loss(services: Services, run: TrainingRun, config: dict[str, float | str]) -> CustomLossProgram:
    """The stored loss that loss_fn_config names (`{"loss_id": ...}`, as forward_backward_custom sends it)."""
    loss_id = config.get("loss_id")
    if not isinstance(loss_id, str) or set(config) != {"loss_id"}:
        raise UserError('loss_fn "custom" takes loss_fn_config {"loss_id": <id>} only', field="loss_fn_config.loss_id")
    program = await services.custom_losses.get(run.session_id, loss_id)
    return program.under(services.config.limits)


@router.post("/optim_step")
async def optim_step(body: wire.OptimStepRequest, services: ServicesDep, user: UserDep) -> dict:
    async def build(request_id: str, run: TrainingRun) -> SequencedOp:
        optimizer = run.lora_config.get("optimizer", "adamw")  # fixed at create_model (AdapterSpec.optimizer)
        if optimizer == "dimuon":
            if body.optimizer_params is None or body.optimizer_params.get("type") != "dimuon":
                raise UserError("this model was created with dimuon: send DimuonParams", field="optimizer_params")
            dimuon = _params(wire.DimuonParams, body.optimizer_params, "optimizer_params")
            return OptimStep(request_id, DimuonParams(**dimuon.model_dump(exclude={"type"})))
        if body.adam_params is None:
            raise UserError("this model was created with adamw: send AdamParams", field="adam_params")
        adam = _params(wire.AdamParams, body.adam_params, "adam_params")
        return OptimStep(request_id, AdamParams(**adam.model_dump()))

    return await sequenced(services, user, "optim_step", body.model_id, body.seq_id, build)
