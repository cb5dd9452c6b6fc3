"""Who the caller is. `presented_key` checks what a request shows for the mode (any `tml-` key from loopback in the
laptop default; else issued or configured keys); `Authenticator` turns the key into its user through the key
store: issued keys belong to their named user, and any other accepted key is enrolled on first use as a user of its
own. Revoked and expired keys are refused. Keys are compared and stored only as hashes, and never logged."""

from __future__ import annotations

import functools
import ipaddress
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from fastapi import Request

from app.api.signatures import same_secret
from app.api.tokens import TokenSigner, looks_like_jwt
from app.caches import remember
from app.db.audit import AuditLog
from app.db.keys import KEY_PREFIX, KeyRecord, KeyStore, key_hash
from app.errors import InvalidToken, Unauthorized

OPEN_PATHS = frozenset({"/api/v1/healthz", "/ready", "/docs", "/openapi.json", "/console"})  # console: no data
OPEN_PREFIXES = ("/console/static/",)  # the console's scripts and styles
# a signature in the URL authorises these
SIGNED_PREFIXES = ("/api/v1/downloads/", "/api/v1/traces/", "/api/v1/uploads/")
HUB_PREFIX = "/hub/"  # Hugging Face clients send their token as `Authorization: Bearer` (HF_TOKEN), never a key
OPENAI_PREFIX = "/v1/"  # so do OpenAI clients (OPENAI_API_KEY), on the OpenAI-compatible routes
BEARER_PREFIXES = (HUB_PREFIX, OPENAI_PREFIX)
LOOPBACK_MODE = "any_tml_key_on_loopback"
_TOUCH_EVERY_S = 60.0  # last_used_at is written at most this often per key and replica


def _is_loopback(host: str | None) -> bool:
    try:
        return host is not None and ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


@functools.lru_cache(maxsize=8)
def _networks(proxies: tuple[str, ...]) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    return tuple(ipaddress.ip_network(p, strict=False) for p in proxies)


def _trusted(host: str, networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]) -> bool:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return any(address in network for network in networks)


def client_address(request: Request, trusted_proxies: Sequence[str]) -> str:
    """The caller's address: the peer's, or, when the peer is one of `trusted_proxies` (auth.trusted_proxies), the
    right-most X-Forwarded-For address that is not (what the first trusted proxy saw; anything left of it is what
    the client claimed). An untrusted peer's X-Forwarded-For is ignored. PROXY protocol is not read: Serve's
    HTTP proxy (uvicorn) does not parse it."""
    peer = request.client.host if request.client else "unknown"
    networks = _networks(tuple(trusted_proxies))
    if not networks or not _trusted(peer, networks):
        return peer
    hops = [h.strip() for v in request.headers.getlist("x-forwarded-for") for h in v.split(",") if h.strip()]
    for hop in reversed(hops):
        if not _trusted(hop, networks):
            return hop
    return hops[0] if hops else peer


def check_mode_fits_bind(mode: str, host: str | None) -> None:
    """Refuse the open laptop mode on a server that listens beyond loopback (behind a proxy on the same host, every
    client would look local and any `tml-` key would do). `host`: where Serve's HTTP proxy binds (None: unknown)."""
    if mode == LOOPBACK_MODE and host is not None and not _is_loopback(host):
        raise ValueError(
            f"auth.mode {LOOPBACK_MODE} accepts any tml- key, but Serve's HTTP proxy binds to {host!r}: bind it to "
            "127.0.0.1 (http_options.host), or set auth.mode: api_keys and issue keys with `tinker-serve keys create`"
        )


def presented_key(request: Request, mode: str) -> str | None:
    """The API key the request presents; None on routes that need none (health, signed links, and on loopback
    the base models' tokenizers). Unauthorized when the mode cannot accept it."""
    if request.url.path in OPEN_PATHS or request.url.path.startswith((*OPEN_PREFIXES, *SIGNED_PREFIXES)):
        return None
    key = request.headers.get("x-api-key", "")
    hub = request.url.path.startswith(HUB_PREFIX)
    if not key and request.url.path.startswith(BEARER_PREFIXES):
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        key = token if scheme.lower() == "bearer" else ""
    if mode == LOOPBACK_MODE:
        loopback = _is_loopback(request.client.host if request.client else None)
        if loopback and (key.startswith(KEY_PREFIX) or looks_like_jwt(key)):
            return key
        if hub and loopback and not key:
            return None
        raise Unauthorized(
            "send an X-API-Key (or Authorization: Bearer on /v1/ and /hub/) starting with 'tml-' from 127.0.0.1 "
            "(any such key is accepted)"
        )
    if not key:
        raise Unauthorized(
            "send your API key in X-API-Key (TINKER_API_KEY; HF_TOKEN for the /hub routes; OPENAI_API_KEY, as "
            "Authorization: Bearer, for the /v1/ routes)"
        )
    return key


@dataclass
class Authenticator:
    mode: str
    configured: frozenset[str]  # keys the operator configured (environment or secret file)
    keys: KeyStore
    cache_s: float  # how long a key's record is trusted before it is read again
    audit: AuditLog  # records a key's use, as often as its last_used_at is written
    tokens: TokenSigner  # JWTs that stand for a key (app.api.tokens)
    _cache: dict[str, tuple[KeyRecord, float]] = field(default_factory=dict)  # key hash -> (record, read at)
    _touched: dict[int, float] = field(default_factory=dict)

    async def authenticate(self, request: Request) -> KeyRecord | None:
        """The record of the caller's key (None on routes that need none); Unauthorized otherwise."""
        key = presented_key(request, self.mode)
        if key is None:
            return None
        now = time.time()
        record = await self._token_record(key, now) if looks_like_jwt(key) else await self._record(key, now)
        if not record.usable(now):
            raise Unauthorized("this API key was revoked or has expired: ask your server's operator for a new one")
        if now - self._touched.get(record.key_id, 0.0) > _TOUCH_EVERY_S:
            self._touched[record.key_id] = now
            await self.keys.touch(record.key_id, now)
            await self.audit.record("apikey_used", record.owner, {"key_id": record.key_id, "origin": record.origin})
        return record

    def forget(self, key_id: int) -> None:
        """Drop what this replica cached of a key (after revoking it here): its next use is refused at once."""
        for cached in [c for c, (record, _) in self._cache.items() if record.key_id == key_id]:
            self._cache.pop(cached, None)

    async def _token_record(self, token: str, now: float) -> KeyRecord:
        """The record of the key a valid JWT stands for."""
        user, key_id = self.tokens.verify(token)
        cache_key = f"key_id:{key_id}"
        cached = self._cache.get(cache_key)
        if cached is not None and now - cached[1] < self.cache_s:
            return cached[0]
        record = await self.keys.by_id(key_id)
        if record is None or record.owner != user:  # e.g. minted by another server: the SDK exchanges its key again
            raise InvalidToken("this token's key is unknown here: exchange your API key again (POST /auth/token)")
        remember(self._cache, cache_key, (record, now))
        return record

    async def _record(self, key: str, now: float) -> KeyRecord:
        digest = key_hash(key)
        cached = self._cache.get(digest)
        if cached is not None and now - cached[1] < self.cache_s:
            return cached[0]
        record = await self.keys.find(key)
        if record is None or record.origin != "issued":  # else accepted while the mode or configuration says so
            if self.mode == LOOPBACK_MODE:
                record = record or await self.keys.enroll(key, "enrolled")
            elif any(same_secret(key, k) for k in self.configured):
                record = record or await self.keys.enroll(key, "configured")
            else:
                raise Unauthorized(
                    "unknown API key: set TINKER_API_KEY (HF_TOKEN for the /hub routes) to a key issued by "
                    "`tinker-serve keys create` or listed in the server's configuration"
                )
        remember(self._cache, digest, (record, now))
        return record
