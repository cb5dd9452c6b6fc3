"""Futures: retrieve_future (one long-poll per future), retrieve_futures (one long-poll for every sample of a
sampling session, as the SDK's session poller asks) and cancel_future."""

from __future__ import annotations

import json

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from app.api.deps import ServicesDep, UserDep
from app.api.quotas import long_poll_slot
from app.db.completions import Target
from app.db.futures import PROTO_CONTENT_TYPE, Completed, Failed, Pending, future_not_found
from app.errors import UserError
from app.operations import call_traits
from app.protocol.wire import CancelFutureRequest, RetrieveFutureRequest, RetrieveFuturesRequest
from app.request_log import log_request
from app.sampling.response import sample_json_from_proto

router = APIRouter(prefix="/api/v1")
# A protobuf result's JSON, by its future's kind: a sample's, and each operation's that declares one (its traits).
_JSON_VIEWS = {
    "sample": sample_json_from_proto,
    **{call: traits.json_view for call, traits in call_traits().items() if traits.json_view is not None},
}


@router.post("/retrieve_future")
async def retrieve_future(
    body: RetrieveFutureRequest, request: Request, services: ServicesDep, user: UserDep
) -> Response:
    if not services.futures.recent.owned_by(body.request_id, user):  # kept with its owner: no read of its row
        await services.future(body.request_id, user)
    with long_poll_slot(services, user):
        outcome = await services.futures.wait(body.request_id, services.config.timeouts.long_poll_seconds)
    if isinstance(outcome, Pending):
        return JSONResponse({"type": "try_again", "request_id": body.request_id, "queue_state": outcome.queue_state})
    if isinstance(outcome, Completed):
        if outcome.content_type == PROTO_CONTENT_TYPE and PROTO_CONTENT_TYPE not in request.headers.get("accept", ""):
            # SDKs before protobuf results; a loss of inf is sent as JSON's Infinity, which Python's json reads
            view = json.dumps(_JSON_VIEWS[outcome.kind](outcome.payload), allow_nan=True, separators=(",", ":"))
            return Response(view, media_type="application/json")
        return Response(outcome.payload, media_type=outcome.content_type)
    if isinstance(outcome, Failed):
        return JSONResponse(outcome.error)
    raise future_not_found(body.request_id)


@router.post("/retrieve_futures")
async def retrieve_futures(body: RetrieveFuturesRequest, services: ServicesDep, user: UserDep) -> dict:
    """The samples of one (sampling session, clone) that finished or failed after `prev_cursor`, waiting up to
    `timeout` (at most timeouts.long_poll_seconds) for one; their payloads are fetched with retrieve_future."""
    session_id = body.target.sampling_session_id
    await services.sampling_session(session_id, user)  # exists (and, if ephemeral, stays alive while polled)
    target = Target(session_id, body.target.cloned_sampler_id)
    completions = services.futures.completions
    await completions.trim(target, body.prev_cursor, idle=body.timeout == 0)  # timeout 0: the poller only acks
    limit = services.config.timeouts.long_poll_seconds
    with long_poll_slot(services, user):
        found = await completions.wait(
            target, body.prev_cursor, limit if body.timeout is None else min(body.timeout, limit)
        )
    return {
        "completions": [completion.to_wire() for completion in found],
        "cursor": found[-1].cursor if found else body.prev_cursor,
    }


@router.post("/cancel_future")
async def cancel_future(body: CancelFutureRequest, services: ServicesDep, user: UserDep) -> dict:
    """Cancel a pending future: it fails at once; its work is dropped if it has not started, and discarded when it
    finishes otherwise. A training operation's later seq_ids run as if it had been skipped. A finished future
    stays as it is (so does its outcome kept in memory: only final rows are kept, and the cancel's own failure
    replaces what this replica held)."""
    await services.future(body.request_id, user)
    cancelled = UserError(f"request {body.request_id} was cancelled (cancel_future)", details={"cancelled": True})
    row = await services.futures.cancel(body.request_id, cancelled.to_body())
    if row is None:  # finished already
        return {}
    if row.kind != "sample" and row.subject_id is not None and row.seq_id:  # a sequenced training operation
        run = await services.training_run(row.subject_id, user)
        await services.trainers.cancel(run.trainer, row.subject_id, row.seq_id, row.request_id)
    log_request("cancelled", op=row.kind, model_id=row.subject_id, seq_id=row.seq_id, tinker_request_id=row.request_id)
    return {}
