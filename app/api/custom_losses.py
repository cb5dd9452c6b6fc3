"""create_custom_loss: a loss traced by the SDK (`ServiceClient.create_custom_loss`), validated against the
allow-list and stored, so `forward_backward_custom` runs it on the trainers in one round trip
(`loss_fn="custom"`, `loss_fn_config={"loss_id": ...}`; app.api.training resolves it)."""

from __future__ import annotations

import json

from fastapi import APIRouter

from app.api.deps import ServicesDep, UserDep
from app.db.custom_losses import loss_id_for
from app.db.futures import JSON_CONTENT_TYPE
from app.errors import LimitExceeded
from app.protocol.wire import CreateCustomLossRequest
from app.request_log import log_request
from app.training_data.custom_losses import validate_custom_loss

router = APIRouter(prefix="/api/v1")


@router.post("/create_custom_loss")
async def create_custom_loss(body: CreateCustomLossRequest, services: ServicesDep, user: UserDep) -> dict:
    """Rejections are immediate user errors naming the node; a valid loss's future is complete at once."""
    await services.session(body.session_id, user)
    limits, quotas = services.config.limits, services.config.quotas
    loss_id = loss_id_for(body.session_id, body.custom_loss_seq_id)
    program = validate_custom_loss(
        loss_id, body.name, body.inputs, body.graph, limits.max_custom_loss_nodes, limits.max_custom_loss_integer
    )
    if await services.custom_losses.count(body.session_id) >= quotas.max_custom_losses_per_session:
        raise LimitExceeded(
            f"this session has {quotas.max_custom_losses_per_session} custom losses, "
            "quotas.max_custom_losses_per_session",
            field="custom_loss_seq_id",
        )
    await services.custom_losses.add(body.session_id, program)
    request_id, created = await services.futures.create("create_custom_loss", loss_id, 0)
    if created:
        payload = json.dumps({"loss_id": loss_id, "type": "create_custom_loss"}).encode()
        await services.futures.complete(request_id, payload, JSON_CONTENT_TYPE)
    log_request("completed" if created else "retried", op="create_custom_loss", tinker_request_id=request_id)
    return {"request_id": request_id}
