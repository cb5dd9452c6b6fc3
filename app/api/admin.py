"""Admin-only REST for users and keys, the same as the console (`tinker-serve keys`, `users`): for users named in
`auth.admin_users`. A new key's secret is in the answer to its creation, once, and nowhere else."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path
from pydantic import BaseModel, Field

from app.api.deps import Services, ServicesDep, UserDep
from app.db.keys import KeyRecord, expiry_after_days
from app.errors import Forbidden
from app.protocol.wire import INT64_MAX

router = APIRouter(prefix="/api/v1/admin")


class CreateKeyRequest(BaseModel):
    user: str = Field(max_length=64)  # users.name
    name: str = Field("key", max_length=200)
    expires_in_days: float | None = Field(None, gt=0)


def _require_admin(services: Services, user: str) -> None:
    if user not in services.config.auth.admin_users:
        raise Forbidden("admin only: ask the operator to add your user to auth.admin_users", field="user")


def key_view(key: KeyRecord) -> dict:
    return {
        "key_id": key.key_id,
        "user": key.owner,
        "name": key.name,
        "hint": key.hint,
        "origin": key.origin,
        "created_at": key.created_at,
        "last_used_at": key.last_used_at,
        "expires_at": key.expires_at,
        "revoked_at": key.revoked_at,
    }


@router.post("/keys")
async def create_key(body: CreateKeyRequest, services: ServicesDep, user: UserDep) -> dict:
    _require_admin(services, user)
    secret, key = await services.auth.keys.issue(body.user, body.name, expiry_after_days(body.expires_in_days))
    details = {"key_id": key.key_id, "name": key.name, "by": "admin REST"}
    await services.audit.record("apikey_created", user, details, subject_owner=key.owner)
    return {"key": secret, **key_view(key)}


@router.get("/keys")
async def list_keys(services: ServicesDep, user: UserDep, owner: str | None = None) -> dict:
    _require_admin(services, user)
    return {"keys": [key_view(k) for k in await services.auth.keys.keys_of(owner)]}


@router.delete("/keys/{key_id}")
async def revoke_key(key_id: Annotated[int, Path(ge=1, le=INT64_MAX)], services: ServicesDep, user: UserDep) -> dict:
    _require_admin(services, user)
    key = await services.auth.keys.revoke(key_id)
    services.auth.forget(key_id)
    details = {"key_id": key.key_id, "name": key.name, "by": "admin REST"}
    await services.audit.record("apikey_revoked", user, details, subject_owner=key.owner)
    return key_view(key)


@router.get("/users")
async def list_users(services: ServicesDep, user: UserDep) -> dict:
    _require_admin(services, user)
    found = await services.auth.keys.users()
    return {"users": [{"name": name, "created_at": created, "live_keys": live} for name, created, live in found]}
