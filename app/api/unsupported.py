"""Routes the SDK can call that this server does not offer yet. Each answers a user error saying why and what to
do instead (400, not 501: the SDK retries every 5xx for minutes). tests/unit/api/test_sdk_coverage.py checks that
every path the installed SDK calls has a route, and README's "SDK coverage" lists these."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fastapi import APIRouter

from app.errors import UserError

router = APIRouter(prefix="/api/v1")

_NOT_YET = "this server has API keys (`tinker-serve keys`) but no JWT exchange yet"


@dataclass(frozen=True)
class Unsupported:
    method: str
    path: str
    reason: str


UNSUPPORTED = (
    Unsupported("POST", "/auth/token", f"JWT exchange: {_NOT_YET}; send the API key itself (client/config never asks)"),
)


def _answer(unsupported: Unsupported) -> Callable[[], Awaitable[dict]]:
    async def endpoint() -> dict:
        raise UserError(f"{unsupported.method} /api/v1{unsupported.path} is not supported: {unsupported.reason}")

    return endpoint


for _entry in UNSUPPORTED:
    router.add_api_route(_entry.path, _answer(_entry), methods=[_entry.method], include_in_schema=False)
