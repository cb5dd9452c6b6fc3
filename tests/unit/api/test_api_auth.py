"""presented_key on hand-built ASGI requests (no network); the Authenticator over a real SQLite key store (enrolment,
issued, configured, revoked and expired keys, hash-only storage); the open health path through the app, and /ready
while the server starts."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.requests import Request

from app.api.auth import Authenticator, check_mode_fits_bind, presented_key
from app.api.rates import RateLimiter
from app.api.tokens import TokenSigner
from app.db.audit import AuditLog
from app.db.keys import KeyStore, enrolled_owner
from app.db.schema import connect
from app.errors import InvalidToken, Unauthorized
from tests.conftest import run_on_db

LOOPBACK = "any_tml_key_on_loopback"
SIGNER = TokenSigner("s" * 32)
HERE = "http://127.0.0.1:8000"  # the loopback mode answers only requests addressed to this machine


def make_request(
    path: str = "/api/v1/create_session", key: str | None = None, client: str | None = "127.0.0.1"
) -> Request:
    headers = [(b"x-api-key", key.encode())] if key is not None else []
    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(b"host", b"localhost:8000"), *headers],
        "scheme": "http",
        "server": ("127.0.0.1", 8000),
        "client": (client, 50000) if client else None,
    }
    return Request(scope)


@pytest.mark.parametrize("client", ["127.0.0.1", "127.8.9.10", "::1", "localhost"])
def test_loopback_accepts_any_tml_key(client: str) -> None:
    assert presented_key(make_request(key="tml-x", client=client), LOOPBACK) == "tml-x"


@pytest.mark.parametrize(
    ("key", "client"),
    [
        ("sk-not-tml", "127.0.0.1"),
        (None, "127.0.0.1"),
        ("TML-upper", "::1"),
        ("tml-x", "10.1.2.3"),
        ("tml-x", "2001:db8::1"),
        ("tml-x", "testclient"),
        ("tml-x", None),
    ],
)
def test_loopback_mode_rejects(key: str | None, client: str | None) -> None:
    with pytest.raises(Unauthorized) as info:
        presented_key(make_request(key=key, client=client), LOOPBACK)
    assert info.value.status_code == 401
    assert info.value.to_body()["category"] == "user"


def test_api_keys_mode_needs_a_key() -> None:
    assert presented_key(make_request(key="secret-2", client="10.1.2.3"), "api_keys") == "secret-2"
    for key in ("", None):
        with pytest.raises(Unauthorized):
            presented_key(make_request(key=key), "api_keys")


@pytest.mark.parametrize("path", ["/api/v1/healthz", "/ready", "/docs", "/openapi.json", "/console"])
def test_open_paths_need_no_key(path: str) -> None:
    assert presented_key(make_request(path, key=None, client="10.1.2.3"), "api_keys") is None
    assert presented_key(make_request(path, key=None, client="10.1.2.3"), LOOPBACK) is None


def _api(tmp_path: Path, trainers: object = None, samplers: object = None) -> FastAPI:
    """The app with only config, auth and the signing key behind it (what the auth dependency and these routes
    reach), and the given trainer and sampler clients."""
    from app.api.deps import Services
    from app.api.main import create_api
    from app.config import ServerConfig

    api = create_api()
    config = ServerConfig(base_models=[{"name": "tiny", "path": "models/tiny"}], auth={"mode": LOOPBACK})
    run_on_db(tmp_path / "keys.sqlite", lambda db: asyncio.sleep(0))  # the tables; the app's engine opens lazily
    db = connect(f"sqlite+aiosqlite:///{tmp_path / 'keys.sqlite'}")
    keys, audit = KeyStore(db), AuditLog(db)
    api.state.services = Services(
        config=config,
        futures=None,
        metadata=None,
        checkpoints=None,  # type: ignore[arg-type]
        checkpoint_search=None,  # type: ignore[arg-type]
        storage=None,
        trainers=trainers,
        sampler_store=None,
        stability=None,
        journal=None,
        history=None,
        session_views=None,
        traces=None,
        usage=None,
        copies=None,
        uploads=None,
        custom_losses=None,
        samplers=samplers,
        model_limits={},
        auth=Authenticator(LOOPBACK, frozenset(), keys, cache_s=0, audit=audit, tokens=SIGNER),
        audit=audit,
        quotas=None,
        request_rate=RateLimiter(60),
        sample_rate=RateLimiter(60),
        failed_auth_rate=RateLimiter(600),
        url_signing_key="k",
    )
    return api


class _Answering:
    """Trainer or sampler clients of which these answer (what /ready asks), and samplers that could not start."""

    def __init__(self, answers: dict[str, bool], failures: dict[str, str] | None = None) -> None:
        self._answers = answers
        self._failures = failures or {}

    async def ready(self) -> dict[str, bool]:
        return self._answers

    async def start_failures(self) -> dict[str, str]:
        return self._failures


def test_ready_while_a_sampler_starts_is_503_naming_it_and_logs_no_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from fastapi.testclient import TestClient

    trainers = _Answering({"tiny": True})
    api = _api(tmp_path, trainers=trainers, samplers=_Answering({"tiny": False}))
    local = TestClient(api, base_url=HERE, client=("127.0.0.1", 40000))
    with caplog.at_level(logging.INFO):
        starting = local.get("/ready")
    assert starting.status_code == 503 and starting.json()["samplers"] == {"tiny": False}
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    why = "the sampler for tiny could not start vLLM"
    api.state.services.samplers = _Answering({"tiny": False}, {"tiny": why})
    failed = local.get("/ready")
    assert failed.status_code == 503 and failed.json()["failed"] == {"tiny": why} and failed.json()["error"] == why
    api.state.services.samplers = _Answering({"tiny": True})
    assert local.get("/ready").json() == {"trainers": {"tiny": True}, "samplers": {"tiny": True}}


def test_healthz_open_through_the_app_and_other_routes_are_not(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    api = _api(tmp_path)
    remote = TestClient(api, base_url=HERE, client=("10.1.2.3", 40000))
    assert remote.get("/api/v1/healthz").json() == {"status": "ok"}
    denied = remote.post("/api/v1/client/config", json={})
    assert denied.status_code == 401 and denied.json()["category"] == "user"
    local = TestClient(api, base_url=HERE, client=("127.0.0.1", 40000))
    ok = local.post("/api/v1/client/config", json={}, headers={"X-API-Key": "tml-abc"})
    assert ok.status_code == 200 and ok.json()["fwdbwd_max_chunk_len"] == 1024
    # quotas.requests_per_minute_per_key, here 60: the 61st call within a second waits (a slow machine's calls
    # refill the bucket by one a second as they go)
    answers = [local.post("/api/v1/client/config", json={}, headers={"X-API-Key": "tml-abc"}) for _ in range(100)]
    limited = next(a for a in answers if a.status_code != 200)
    assert answers.index(limited) >= 59 and limited.status_code == 429 and limited.headers["retry-after"] == "1"
    other_key = local.post("/api/v1/client/config", json={}, headers={"X-API-Key": "tml-def"})
    assert other_key.status_code == 200  # per key
    # Download links need no key but a valid signature: a forged one is refused before anything is read.
    forged = remote.get("/api/v1/downloads/m:train:0/e1/adapter_config.json?expires=9999999999&signature=00")
    assert forged.status_code == 403 and forged.json()["field"] == "signature"


def test_hub_routes_take_the_key_as_a_bearer_token() -> None:
    """Hugging Face clients send HF_TOKEN as `Authorization: Bearer`; on loopback the tokenizer files need none."""
    assert presented_key(make_request(path="/hub/tinker-serve/tiny/resolve/main/config.json"), LOOPBACK) is None
    with pytest.raises(Unauthorized):
        presented_key(make_request(path="/hub/a/b/resolve/main/config.json", client="10.1.2.3"), LOOPBACK)
    request = make_request(path="/hub/a/b/resolve/main/config.json", client="10.1.2.3")
    request.scope["headers"].append((b"authorization", b"Bearer secret-1"))
    assert presented_key(request, "api_keys") == "secret-1"
    for header in (b"Basic secret-1", b"secret-1"):
        request = make_request(path="/hub/a/b/resolve/main/config.json", client="10.1.2.3")
        request.scope["headers"].append((b"authorization", header))
        with pytest.raises(Unauthorized):
            presented_key(request, "api_keys")
    api_request = make_request(path="/api/v1/create_session", client="10.1.2.3")  # the Tinker API wants X-API-Key
    api_request.scope["headers"].append((b"authorization", b"Bearer secret-1"))
    with pytest.raises(Unauthorized):
        presented_key(api_request, "api_keys")


def test_openai_routes_take_the_key_as_a_bearer_token() -> None:
    """The openai client sends its api_key as `Authorization: Bearer`; X-API-Key works there too, and no key is
    refused even on loopback."""
    for path, mode in (("/v1/completions", "api_keys"), ("/v1/models", LOOPBACK)):
        request = make_request(path=path)
        request.scope["headers"].append((b"authorization", b"Bearer tml-secret-1"))
        assert presented_key(request, mode) == "tml-secret-1"
        assert presented_key(make_request(path=path, key="tml-secret-2"), mode) == "tml-secret-2"
        with pytest.raises(Unauthorized, match="Bearer"):
            presented_key(make_request(path=path), mode)


def test_each_key_is_a_user_and_refused_once_revoked_or_expired(tmp_path: Path) -> None:
    async def body(db: AsyncEngine) -> None:
        keys = KeyStore(db)
        audit = AuditLog(db)
        loopback = Authenticator(LOOPBACK, frozenset(), keys, cache_s=0, audit=audit, tokens=SIGNER)

        async def owner(auth: Authenticator, key: str, client: str = "127.0.0.1") -> str:
            record = await auth.authenticate(make_request(key=key, client=client))
            assert record is not None
            return record.owner

        alice, bob = await owner(loopback, "tml-alice"), await owner(loopback, "tml-bob")  # enrolled on first use
        assert alice == enrolled_owner("tml-alice") != bob and "alice" not in alice
        assert await owner(loopback, "tml-alice") == alice
        secret, issued = await keys.issue("carol", "laptop")
        assert secret.startswith("tml-") and len(secret) > 40 and await owner(loopback, secret) == "carol"

        configured = Authenticator("api_keys", frozenset({"ops-key"}), keys, cache_s=0, audit=audit, tokens=SIGNER)
        assert await owner(configured, secret, client="10.1.2.3") == "carol"
        assert await owner(configured, "ops-key", client="10.1.2.3") == enrolled_owner("ops-key")
        for unknown in ("tml-alice", "ops-", "tml-never-seen"):  # enrolled on loopback is not enough here
            with pytest.raises(Unauthorized):
                await owner(configured, unknown, client="10.1.2.3")

        token = SIGNER.mint("carol", issued.key_id, ttl_s=60)  # a JWT stands for its key, from any address
        assert await owner(loopback, token) == await owner(configured, token, client="10.1.2.3") == "carol"
        with pytest.raises(InvalidToken, match="unknown here"):
            await owner(configured, SIGNER.mint("mallory", issued.key_id, ttl_s=60), client="10.1.2.3")
        await keys.revoke(issued.key_id)
        for revoked in (secret, token):
            with pytest.raises(Unauthorized, match="revoked or has expired"):
                await owner(loopback, revoked)
        short, _ = await keys.issue("dave", "ci", expires_at=time.time() + 0.2)
        assert await owner(loopback, short) == "dave"
        await asyncio.sleep(0.3)
        with pytest.raises(Unauthorized, match="revoked or has expired"):
            await owner(loopback, short)
        assert {(k.owner, k.origin) for k in await keys.keys_of()} >= {("carol", "issued"), (alice, "enrolled")}

    path = tmp_path / "keys.sqlite"
    run_on_db(path, body)
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("keys.sqlite*"))
    assert b"tml-" not in stored and b"ops-key" not in stored  # hashes only


def test_the_open_mode_refuses_a_proxy_beyond_loopback() -> None:
    for host in ("127.0.0.1", "::1", "localhost", None):  # None: Serve's options could not be read
        check_mode_fits_bind(LOOPBACK, host)
    check_mode_fits_bind("api_keys", "0.0.0.0")
    for host in ("0.0.0.0", "10.1.2.3", "::"):
        with pytest.raises(ValueError, match=r"set auth\.mode: api_keys"):
            check_mode_fits_bind(LOOPBACK, host)
