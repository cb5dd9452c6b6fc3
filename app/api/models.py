"""Training models: create, describe, unload."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import asdict

from fastapi import APIRouter

from app.api.deps import Services, ServicesDep, UserDep
from app.api.quotas import check_live_models
from app.api.sessions import unload
from app.api.user_caps import check_run_room
from app.config import ROLES, BaseModelConfig
from app.db.metadata import TrainingRun, model_id_for
from app.db.outcomes import Pending
from app.errors import LimitExceeded, UserError
from app.messages import AdapterSpec
from app.operations.create_model import CreateModel
from app.operations.load_checkpoint import LoadCheckpoint
from app.protocol.wire import CreateModelRequest, GetInfoRequest, LoraConfig, UnloadModelRequest
from app.request_log import log_request

router = APIRouter(prefix="/api/v1")


def _model_role(body: CreateModelRequest) -> str:
    """The role asked for by the `model_role` field or, from the unmodified SDK, `user_metadata["model_role"]`."""
    from_metadata = (body.user_metadata or {}).get("model_role")
    if body.model_role is not None and from_metadata is not None and body.model_role != from_metadata:
        raise UserError(
            f"model_role {body.model_role!r} contradicts user_metadata.model_role {from_metadata!r}", field="model_role"
        )
    role, field = (
        (body.model_role, "model_role") if body.model_role is not None else (from_metadata, "user_metadata.model_role")
    )
    if role is None:
        return "policy"
    if role not in ROLES:
        raise UserError(f"{field} must be one of {list(ROLES)}, got {role!r}", field=field)
    return role


@router.post("/create_model")
async def create_model(body: CreateModelRequest, services: ServicesDep, user: UserDep) -> dict:
    base = services.served_base_model(body.base_model)
    role = _model_role(body)
    lora = body.lora_config
    check_lora_config(services, lora)
    optimizer = optimizer_of(body.optimizer_config) or "adamw"

    def spec() -> AdapterSpec:
        seed = lora.seed if lora.seed is not None else random.SystemRandom().randrange(2**31)
        return AdapterSpec(
            rank=lora.rank,
            seed=seed,
            train_attn=lora.train_attn,
            train_mlp=lora.train_mlp,
            role=role,
            optimizer=optimizer,
        )

    return await register_model(
        services, user, "create_model", body.session_id, body.model_seq_id, base, spec, body.user_metadata
    )


def check_lora_config(services: Services, lora: LoraConfig) -> None:
    """That this server can train and sample adapters of `lora`: its rank within engine.max_lora_rank, and some
    layers adapted."""
    if lora.rank > services.config.engine.max_lora_rank:
        raise LimitExceeded(
            f"lora_config.rank {lora.rank} exceeds engine.max_lora_rank={services.config.engine.max_lora_rank}",
            field="lora_config.rank",
        )
    if not (lora.train_attn or lora.train_mlp):
        raise UserError(
            "set train_attn or train_mlp: this server does not adapt the unembedding (vLLM samplers "
            "cannot serve lm_head LoRAs), so train_unembed alone trains nothing",
            field="lora_config",
        )


def optimizer_of(config: dict | None) -> str | None:
    """The optimizer an optimizer_config selects (None when absent): `adamw`, or `dimuon` version 1."""
    if not config:
        return None
    kind = config.get("type", "adamw")
    if kind not in ("adamw", "dimuon"):
        raise UserError(
            f"optimizer_config.type must be 'adamw' or 'dimuon', got {kind!r}", field="optimizer_config.type"
        )
    if kind == "dimuon" and config.get("version", 1) != 1:
        raise UserError("optimizer_config.version must be 1 for dimuon", field="optimizer_config.version")
    return str(kind)


def optimizer_config(optimizer: str) -> dict:
    """What get_info reports: the SDK's AdamOptimizerConfig or DimuonOptimizerConfig."""
    return {"type": "dimuon", "version": 1} if optimizer == "dimuon" else {"type": "adamw"}


async def register_model(
    services: Services,
    user: str,
    kind: str,
    session_id: str,
    model_seq_id: int,
    base: BaseModelConfig,
    spec: Callable[[], AdapterSpec],
    user_metadata: dict | None,
    load: Callable[[str], LoadCheckpoint] | None = None,
) -> dict:
    """Record the model `{session_id}:train:{model_seq_id}` in `user`'s session (its training run and its route to
    a trainer) and have that trainer create it, filled from a checkpoint by `load(request_id)` if given.
    A retry finds the first request's future; while that is pending, it does the hand-over again (idempotently),
    since the first attempt may have died before the trainer had it."""
    await services.session(session_id, user)
    model_id = model_id_for(session_id, model_seq_id)
    await check_live_models(services, user, model_id)
    await check_run_room(services, user, model_id, user_metadata or {})
    request_id, created = await services.futures.create(kind, model_id, 0)
    handed_over = created or isinstance(await services.futures.get(request_id), Pending)
    if handed_over:
        adapter = spec()
        trainer = base.trainer_for(adapter.role)
        await services.metadata.add_training_run(
            TrainingRun(
                model_id=model_id,
                session_id=session_id,
                base_model=base.name,
                lora_rank=adapter.rank,
                role=adapter.role,
                trainer=trainer,
                lora_config={k: v for k, v in asdict(adapter).items() if k != "role"},
                user_metadata=user_metadata or {},
                created_at=time.time(),
                unloaded=False,
            ),
            exists_ok=not created,
        )
        creation = CreateModel(request_id, adapter, load(request_id) if load else None)
        await services.journal.append(model_id, 0, creation)  # how a restarted trainer makes the model again
        services.trainers.create_model(trainer, model_id, creation, user)
    if created:
        await services.audit.record("model_created", user, {"model_id": model_id, "base_model": base.name, "via": kind})
    outcome = "queued" if created else "queued again" if handed_over else "retried"
    log_request(outcome, op=kind, model_id=model_id, seq_id=0, tinker_request_id=request_id)
    return {"request_id": request_id, "model_id": model_id}


@router.post("/get_info")
async def get_info(body: GetInfoRequest, services: ServicesDep, user: UserDep) -> dict:
    run = await services.training_run(body.model_id, user)
    served = services.model_limits.get(run.base_model)
    arch = served.arch if served else None  # a base no longer served: its family is not known here
    tokenizer_id = served.tokenizer_id if served and served.tokenizer_id else run.base_model
    return {
        "model_id": run.model_id,
        "model_data": {"arch": arch, "model_name": run.base_model, "tokenizer_id": tokenizer_id},
        "is_lora": True,
        "lora_rank": run.lora_rank,
        "model_name": run.base_model,
        "optimizer_config": optimizer_config(run.lora_config.get("optimizer", "adamw")),
        "type": "get_info",
    }


@router.post("/unload_model")
async def unload_model(body: UnloadModelRequest, services: ServicesDep, user: UserDep) -> dict:
    run = await services.training_run(body.model_id, user)
    return {"request_id": await unload(services, run), "model_id": run.model_id}
