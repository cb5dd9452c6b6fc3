"""X-API-Key checks, and who the caller is: any `tml-` key from loopback in the laptop default, else configured keys
only. Each distinct key is its own user, named by a hash of the key (the key itself is never stored or logged)."""

from __future__ import annotations

import hashlib
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


def user_id_of(key: str) -> str:
    """The user a key stands for: `user-` and 16 hex digits of its SHA-256 (one-way: the id reveals no key)."""
    return "user-" + hashlib.sha256(key.encode()).hexdigest()[:16]


def check_api_key(request: Request, mode: str, keys: frozenset[str]) -> str | None:
    """The caller's user id; None on routes that need no key (health, signed links, the base models' tokenizers
    on loopback). Unauthorized when the key is missing or unknown."""
    if request.url.path in OPEN_PATHS or request.url.path.startswith(SIGNED_PREFIXES):
        return None
    key = request.headers.get("x-api-key", "")
    hub = request.url.path.startswith(HUB_PREFIX)
    if hub and not key:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        key = token if scheme.lower() == "bearer" else ""
    if mode == "any_tml_key_on_loopback":
        client = request.client.host if request.client else None
        if _is_loopback(client) and key.startswith("tml-"):
            return user_id_of(key)
        if hub and _is_loopback(client):  # the base models' tokenizers need no key
            return None
        raise Unauthorized("send an X-API-Key starting with 'tml-' from 127.0.0.1 (any such key is accepted)")
    if not any(hmac.compare_digest(key, k) for k in keys):
        raise Unauthorized(
            "unknown API key: set TINKER_API_KEY (HF_TOKEN for the /hub routes) to a key listed in "
            "the server's configuration"
        )
    return user_id_of(key)
