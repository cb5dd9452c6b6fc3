"""X-API-Key checks: any `tml-` key from loopback in the laptop default, else configured keys only."""

from __future__ import annotations

import hmac
import ipaddress

from fastapi import Request

from app.errors import Unauthorized

OPEN_PATHS = frozenset({"/api/v1/healthz", "/ready", "/docs", "/openapi.json"})
SIGNED_PREFIXES = ("/api/v1/downloads/", "/api/v1/traces/")  # a signature in the URL authorises these
HUB_PREFIX = "/hub/"  # Hugging Face clients send their token as `Authorization: Bearer` (HF_TOKEN), never a key


def _is_loopback(host: str | None) -> bool:
    try:
        return host is not None and ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def check_api_key(request: Request, mode: str, keys: frozenset[str]) -> None:
    if request.url.path in OPEN_PATHS or request.url.path.startswith(SIGNED_PREFIXES):
        return
    key = request.headers.get("x-api-key", "")
    hub = request.url.path.startswith(HUB_PREFIX)
    if hub and not key:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        key = token if scheme.lower() == "bearer" else ""
    if mode == "any_tml_key_on_loopback":
        client = request.client.host if request.client else None
        if (hub or key.startswith("tml-")) and _is_loopback(client):  # the base models' tokenizers need no key
            return
        raise Unauthorized("send an X-API-Key starting with 'tml-' from 127.0.0.1 (any such key is accepted)")
    if not any(hmac.compare_digest(key, k) for k in keys):
        raise Unauthorized(
            "unknown API key: set TINKER_API_KEY (HF_TOKEN for the /hub routes) to a key listed in "
            "the server's configuration"
        )
