"""The caller's own API key, as `tinker auth login` / `logout` ask: `GET /auth/apikey/me` describes it and
`DELETE /auth/apikey/me` revokes it (and nothing else); and `POST /auth/token` exchanges it for a short-lived JWT
(app.api.tokens). Issuing and listing keys is the operator's job: `tinker-serve keys`."""

from __future__ import annotations

from fastapi import APIRouter, Request

from app.api.deps import ServicesDep
from app.db.keys import KeyRecord
from app.errors import UserError

router = APIRouter(prefix="/api/v1")
ORGANIZATION = "tinker-serve"


def _caller_key(request: Request) -> KeyRecord:
    record: KeyRecord = request.state.key  # always set: these routes need a key (app.api.gate.RequestGate)
    return record


@router.get("/auth/apikey/me")
async def describe_own_key(request: Request) -> dict:
    """The SDK's SelfApiKeyResponse; the user's name stands where the hosted service has an email."""
    record = _caller_key(request)
    return {
        "key_id": record.key_id,
        "name": record.name,
        "note": f"{record.origin} key ending in {record.hint}",
        "details": {"org_details": {"name": ORGANIZATION}, "user_details": {"email": record.owner}},
    }


@router.delete("/auth/apikey/me")
async def revoke_own_key(request: Request, services: ServicesDep) -> dict:
    """Revoke the key this request presents: its next call, on any replica, is refused (within
    auth.key_cache_seconds on the others)."""
    record = _caller_key(request)
    await services.auth.keys.revoke(record.key_id, owner=record.owner)
    services.auth.forget(record.key_id)
    await services.audit.record("apikey_revoked", record.owner, {"key_id": record.key_id, "by": "its holder"})
    return {}


@router.post("/auth/token")
async def exchange_for_token(request: Request, services: ServicesDep) -> dict:
    """A JWT standing for the caller's key, valid auth.jwt_ttl_seconds (the SDK refreshes it at half its life)."""
    auth = services.config.auth
    if not auth.jwt_enabled:
        raise UserError("JWT exchange is off on this server (auth.jwt_enabled): send the API key itself")
    record = _caller_key(request)
    return {"jwt": services.auth.tokens.mint(record.owner, record.key_id, auth.jwt_ttl_seconds)}
