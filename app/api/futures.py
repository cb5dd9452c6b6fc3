"""retrieve_future: a long-poll answering try_again, the stored result, or the stored failure."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from app.api.deps import ServicesDep
from app.db.futures import PROTO_CONTENT_TYPE, Completed, Failed, Pending
from app.errors import NotFound
from app.protocol.codec import forward_backward_json_from_proto
from app.protocol.wire import RetrieveFutureRequest
from app.sampling.response import sample_json_from_proto

router = APIRouter(prefix="/api/v1")
_JSON_VIEWS = {"forward_backward": forward_backward_json_from_proto, "sample": sample_json_from_proto}


@router.post("/retrieve_future")
async def retrieve_future(body: RetrieveFutureRequest, request: Request, services: ServicesDep) -> Response:
    outcome = await services.futures.wait(body.request_id, services.config.limits.long_poll_seconds)
    if isinstance(outcome, Pending):
        return JSONResponse({"type": "try_again", "request_id": body.request_id, "queue_state": outcome.queue_state})
    if isinstance(outcome, Completed):
        if outcome.content_type == PROTO_CONTENT_TYPE and PROTO_CONTENT_TYPE not in request.headers.get("accept", ""):
            return JSONResponse(_JSON_VIEWS[outcome.kind](outcome.payload))  # SDKs before protobuf results
        return Response(outcome.payload, media_type=outcome.content_type)
    if isinstance(outcome, Failed):
        return JSONResponse(outcome.error)
    raise NotFound(f"unknown request_id {body.request_id!r}", field="request_id")
