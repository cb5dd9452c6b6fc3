"""Bootstrap and session endpoints: client config, capabilities, sessions, heartbeats, telemetry."""

from __future__ import annotations

from fastapi import APIRouter, Body

from app.api.deps import ServicesDep, UserDep
from app.api.sessions import unload_session_models
from app.api.user_caps import check_session_room
from app.errors import Gone
from app.protocol.wire import CreateSessionRequest, FinishSessionRequest, SessionHeartbeatRequest

router = APIRouter(prefix="/api/v1")
# the tinker SDK releases served, oldest to newest (docs/guides/sdk-versions.md; 0.39-0.40 built from their docs)
SUPPORTED_SDK_VERSIONS = {"min": "0.25", "max": "0.40"}


@router.post("/client/config")
async def client_config(services: ServicesDep) -> dict:
    return {
        "use_pyqwest_transport": False,
        "fwdbwd_max_chunk_len": services.config.limits.fwdbwd_max_chunk_len,
        "proto_compress_fwdbwd": False,
        "sample_use_retrieve_futures": services.config.features.sample_use_retrieve_futures,
        "sample_join_sampling_session": True,
        "custom_loss_server_side": True,  # forward_backward_custom runs here (app.api.custom_losses)
        "pjwt_auth_enabled": services.config.auth.jwt_enabled,  # exchange the key for JWTs (app.api.tokens)
    }


@router.post("/client/dynamic_config")
async def dynamic_config() -> dict:
    return {"sample_cancel_enabled": True}


@router.get("/healthz")
async def healthz() -> dict:
    return {"status": "ok"}


@router.get("/get_server_capabilities")
async def capabilities(services: ServicesDep) -> dict:
    models = [
        {"model_name": name, "max_context_length": limits.max_context_length, "trainable": True, "sampleable": True}
        for name, limits in services.model_limits.items()
    ]
    return {"supported_models": models, "supported_sdk_versions": SUPPORTED_SDK_VERSIONS}


@router.post("/create_session")
async def create_session(body: CreateSessionRequest, services: ServicesDep, user: UserDep) -> dict:
    await check_session_room(services, user, body.tags, body.user_metadata or {})
    session_id = await services.metadata.create_session(
        body.sdk_version, body.tags, body.user_metadata or {}, body.project_id, body.display_name, owner=user
    )
    return {"session_id": session_id, "type": "create_session"}


@router.post("/session_heartbeat")
async def heartbeat(body: SessionHeartbeatRequest, services: ServicesDep, user: UserDep) -> dict:
    if not await services.owns(user, body.session_id) or not await services.metadata.heartbeat(body.session_id):
        raise Gone(f"session {body.session_id!r} does not exist or has ended", field="session_id")
    return {"type": "session_heartbeat"}


@router.post("/sessions/{session_id}/finish")
async def finish_session(
    session_id: str, services: ServicesDep, user: UserDep, body: FinishSessionRequest = Body(None)
) -> dict:
    if not await services.owns(user, session_id):  # as for a missing session: finishing is harmless
        return {}
    reason = (body.reason.type if body and body.reason else None) or "success"
    await services.metadata.finish_session(session_id, reason)
    await unload_session_models(services, session_id)
    return {}


@router.post("/telemetry")
async def telemetry() -> dict:
    return {"status": "accepted"}
