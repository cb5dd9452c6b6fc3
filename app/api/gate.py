"""The ASGI layer in front of routing, run before any byte of a request's body is read: in the loopback mode the
Host and Origin must name this machine (a web page rebound to 127.0.0.1 is refused), the key is checked, the key's
request rate is charged (or, for signed links and key-less /hub requests, the client's), and the body is capped by
its route's class. Unauthenticated bodies are never read; a body over its cap is refused by its Content-Length, or,
sent without one, as soon as it passes the cap.

Refused keys are throttled per client address (behind auth.trusted_proxies, the address they forwarded for), and
only the refused ones: a key that authenticates is never refused for its address's failures (a NAT or a proxy
shares one address among many users). Past the budget a refused attempt answers 429 instead of 401, and a key that
was refused before, or that the key index (app.api.key_index) does not hold, costs that address no key-store lookup."""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.requests import Request

from app.api.auth import HUB_PREFIX, LOOPBACK_MODE, SIGNED_PREFIXES, Authenticator, client_address, presented_key
from app.api.error_responses import error_response
from app.api.key_index import KeyIndex
from app.api.quotas import check_request_rate
from app.api.rates import RateLimiter
from app.api.tokens import looks_like_jwt
from app.api.uploads import UPLOAD_PREFIX
from app.caches import remember
from app.config import LimitsConfig, QuotasConfig
from app.errors import BodyTooLarge, Forbidden, Overloaded, TinkerServeError, Unauthorized
from app.operations import call_traits

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# the calls of the operations that carry training data (their declared traits: app.operations)
TRAINING_DATA_PATHS = frozenset(f"/api/v1/{call}" for call, traits in call_traits().items() if traits.carries_batch)
SAMPLING_PATHS = frozenset(
    {"/api/v1/asample", "/v1/completions", "/v1/chat/completions", "/v1/messages", "/v1/messages/count_tokens"}
)
REFUSED_REMEMBERED = 10_000  # (client, credential) pairs refused, per replica
KEYLESS_CHARGED = (*SIGNED_PREFIXES, HUB_PREFIX)  # read files without a key: charged to the client's keyless rate


def body_limit(path: str) -> str:
    """The limit on the bytes a request to `path` may send: training data, sampling (prompts may hold images), or
    control (every other route)."""
    if path in TRAINING_DATA_PATHS:
        return "max_request_bytes"
    if path in SAMPLING_PATHS:
        return "max_sample_request_bytes"
    return "max_control_request_bytes"


def _host_of(authority: str) -> str:
    """The host of a Host header or an Origin's authority: `[::1]:8000` -> `::1`, `localhost:8000` -> `localhost`."""
    if authority.startswith("["):
        return authority[1:].partition("]")[0]
    return authority.rpartition(":")[0] if authority.count(":") == 1 else authority


def _names_this_machine(authority: str) -> bool:
    host = _host_of(authority.strip().lower())
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_loopback_origin(request: Request) -> None:
    """In the loopback mode, where any `tml-` key is accepted: a request must be addressed to this machine by name
    (Host) and, from a browser, come from a page of this machine (Origin). A page of another site that rebinds its
    name to 127.0.0.1 (DNS rebinding) sends its own name in both."""
    if not _names_this_machine(request.headers.get("host", "")):
        raise Forbidden(
            "the Host header must name this machine (127.0.0.1 or localhost) in the loopback auth mode; to serve "
            "other names set auth.mode: api_keys",
            field="host",
        )
    origin = request.headers.get("origin")
    if origin is not None and not _names_this_machine(origin.partition("://")[2] or origin):
        raise Forbidden(f"requests from pages of {origin!r} are refused in the loopback auth mode", field="origin")


class RequestGate:
    """ASGI middleware: Host/Origin, key, request rate and body size before routing (see the module's docstring).
    Sets `scope["state"]` `key` (the caller's key record) and `user`: None on routes that need no key."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._refused: dict[str, bool] = {}  # "client credential-digest" refused here before
        self._keyless: RateLimiter | None = None  # per client: signed links, key-less /hub (built on first use)
        self._index: KeyIndex | None = None  # the keys that exist (built on first use)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)  # headers, path and client only: the body stays unread
        services = request.app.state.services
        try:
            await self._admit(request, services)
            if not request.url.path.startswith(UPLOAD_PREFIX):  # an upload's file: its route bounds it as it streams
                receive = await _capped(request, receive, body_limit(request.url.path), services.config.limits)
        except TinkerServeError as exc:
            await error_response(request.url.path, exc)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    async def _admit(self, request: Request, services: Any) -> None:
        state = request.scope.setdefault("state", {})
        state["key"] = state["user"] = None
        auth = services.auth
        if auth.mode == LOOPBACK_MODE:
            check_loopback_origin(request)
        client = client_address(request, services.config.auth.trusted_proxies)
        refused = f"{client} {_credential(request)}"
        if (wait := services.failed_auth_rate.waiting(client)) and (
            refused in self._refused or not await self._may_exist(request, auth)
        ):
            raise _throttled(client, wait)  # past its budget, the address's made-up keys cost no key-store lookup
        try:
            record = await auth.authenticate(request)
        except Unauthorized:
            remember(self._refused, refused, True, limit=REFUSED_REMEMBERED)
            if wait := services.failed_auth_rate.take(client, 1):
                raise _throttled(client, wait) from None
            raise
        if record is not None:
            check_request_rate(services, record.key_id)
        elif request.url.path.startswith(KEYLESS_CHARGED):
            self._charge_keyless(client, services.config.quotas)
        state["key"] = record
        state["user"] = record.owner if record is not None else None

    async def _may_exist(self, request: Request, auth: Authenticator) -> bool:
        """Whether the request's key may authenticate, asking the key index (app.api.key_index) instead of the key
        store where a lookup would read it: a plain key in the api_keys mode (any `tml-` key on loopback is
        enrolled, a JWT is checked by its signature first, and a malformed key costs nothing)."""
        try:
            key = presented_key(request, auth.mode)
        except Unauthorized:
            return False
        if key is None or auth.mode == LOOPBACK_MODE or looks_like_jwt(key):
            return True
        if self._index is None:
            self._index = KeyIndex(auth.keys, auth.configured)
        return await self._index.exists(key)

    def _charge_keyless(self, client: str, quotas: QuotasConfig) -> None:
        per_minute = quotas.keyless_requests_per_minute_per_client
        if self._keyless is None:
            self._keyless = RateLimiter(per_minute)
        if wait := self._keyless.take(client, 1, per_minute=per_minute):
            raise Overloaded(
                f"too many requests without a key (signed links, /hub) from {client} "
                f"(quotas.keyless_requests_per_minute_per_client={per_minute}); retry in {wait:.0f} s",
                retry_after_s=int(wait) + 1,
            )


def _credential(request: Request) -> str:
    """A 64-bit digest of what the request presents as its key (X-API-Key and Authorization): what the gate keeps
    of a refused one."""
    headers = request.headers
    presented = f"{headers.get('x-api-key')}\n{headers.get('authorization')}"
    return hashlib.sha256(presented.encode()).hexdigest()[:16]


def _throttled(client: str, wait: float) -> Overloaded:
    return Overloaded(
        f"too many requests from {client} with keys that were refused "
        f"(quotas.failed_auth_per_minute_per_client); retry in {wait:.0f} s",
        retry_after_s=int(wait) + 1,
    )


async def _capped(request: Request, receive: Receive, limit: str, limits: LimitsConfig) -> Receive:
    """`receive`, refusing a body over the `limit` bytes: at once by its Content-Length; else (chunked) read here up
    to the cap, and replayed to the app."""
    cap: int = getattr(limits, limit)
    too_large = BodyTooLarge(f"the request body exceeds this route's limits.{limit}={cap} bytes", field="body")
    length = request.headers.get("content-length")
    if length is not None:
        if not length.isdigit() or int(length) > cap:
            raise too_large
        return receive
    if request.method in ("GET", "HEAD", "DELETE", "OPTIONS"):
        return receive
    chunks, size, more = [], 0, True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            return _replay([message])
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if size > cap:
            raise too_large
        more = message.get("more_body", False)
    return _replay([{"type": "http.request", "body": b"".join(chunks), "more_body": False}], tail=receive)


def _replay(messages: list[Message], tail: Receive | None = None) -> Receive:
    async def receive() -> Message:
        if messages:
            return messages.pop(0)
        if tail is None:
            return {"type": "http.disconnect"}
        return await tail()

    return receive
