"""check_api_key on hand-built ASGI requests (no network), and the open health path through the app."""

from __future__ import annotations

import pytest
from starlette.requests import Request

from app.api.auth import check_api_key
from app.errors import Unauthorized

LOOPBACK = "any_tml_key_on_loopback"


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
    check_api_key(make_request(key="tml-x", client=client), LOOPBACK, frozenset())


def test_each_key_is_its_own_user_named_without_the_key() -> None:
    alice, bob = (check_api_key(make_request(key=k), LOOPBACK, frozenset()) for k in ("tml-alice", "tml-bob"))
    assert alice == check_api_key(make_request(key="tml-alice", client="::1"), LOOPBACK, frozenset())
    assert alice is not None and bob is not None and alice != bob
    assert "alice" not in alice and alice.startswith("user-")
    keys = frozenset({"secret-1", "secret-2"})
    configured = {check_api_key(make_request(key=k, client="10.1.2.3"), "api_keys", keys) for k in sorted(keys)}
    assert len(configured) == 2 and not any("secret" in str(user) for user in configured)


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
        check_api_key(make_request(key=key, client=client), LOOPBACK, frozenset())
    assert info.value.status_code == 401
    assert info.value.to_body()["category"] == "user"


def test_api_keys_mode_accepts_only_configured_keys() -> None:
    keys = frozenset({"secret-1", "secret-2"})
    check_api_key(make_request(key="secret-2", client="10.1.2.3"), "api_keys", keys)
    for key in ("tml-x", "secret-", "secret-10", "", None):
        with pytest.raises(Unauthorized):
            check_api_key(make_request(key=key, client="127.0.0.1"), "api_keys", keys)


def test_api_keys_mode_with_no_keys_rejects_empty_key() -> None:
    with pytest.raises(Unauthorized):
        check_api_key(make_request(key=""), "api_keys", frozenset())


@pytest.mark.parametrize("path", ["/api/v1/healthz", "/ready", "/docs", "/openapi.json"])
def test_open_paths_need_no_key(path: str) -> None:
    check_api_key(make_request(path, key=None, client="10.1.2.3"), "api_keys", frozenset({"k"}))
    check_api_key(make_request(path, key=None, client="10.1.2.3"), LOOPBACK, frozenset())


def test_healthz_open_through_the_app_and_other_routes_are_not() -> None:
    from fastapi.testclient import TestClient

    from app.api.deps import Services
    from app.api.main import create_api
    from app.config import ServerConfig

    api = create_api()
    config = ServerConfig(base_models=[{"name": "tiny", "path": "models/tiny"}], auth={"mode": LOOPBACK})
    # Only config, api_keys and the signing key are reached by the auth dependency and these routes.
    api.state.services = Services(
        config=config,
        futures=None,
        metadata=None,
        checkpoints=None,  # type: ignore[arg-type]
        storage=None,
        trainers=None,
        sampler_store=None,
        stability=None,
        session_views=None,
        traces=None,
        usage=None,
        copies=None,
        custom_losses=None,
        samplers=None,
        model_limits={},
        api_keys=frozenset(),
        url_signing_key="k",
    )
    remote = TestClient(api, client=("10.1.2.3", 40000))
    assert remote.get("/api/v1/healthz").json() == {"status": "ok"}
    denied = remote.post("/api/v1/client/config", json={})
    assert denied.status_code == 401 and denied.json()["category"] == "user"
    local = TestClient(api, client=("127.0.0.1", 40000))
    ok = local.post("/api/v1/client/config", json={}, headers={"X-API-Key": "tml-abc"})
    assert ok.status_code == 200 and ok.json()["fwdbwd_max_chunk_len"] == 1024
    # Download links need no key but a valid signature: a forged one is refused before anything is read.
    forged = remote.get("/api/v1/downloads/m:train:0/e1/adapter_config.json?expires=9999999999&signature=00")
    assert forged.status_code == 403 and forged.json()["field"] == "signature"


def test_hub_routes_take_the_key_as_a_bearer_token() -> None:
    """Hugging Face clients send HF_TOKEN as `Authorization: Bearer`; on loopback the tokenizer files need none."""
    check_api_key(make_request(path="/hub/tinker-serve/tiny/resolve/main/config.json"), LOOPBACK, frozenset())
    with pytest.raises(Unauthorized):
        check_api_key(make_request(path="/hub/a/b/resolve/main/config.json", client="10.1.2.3"), LOOPBACK, frozenset())
    keys = frozenset({"secret-1"})
    request = make_request(path="/hub/a/b/resolve/main/config.json", client="10.1.2.3")
    request.scope["headers"].append((b"authorization", b"Bearer secret-1"))
    check_api_key(request, "api_keys", keys)
    for header in (b"Bearer secret-2", b"Basic secret-1", b"secret-1"):
        request = make_request(path="/hub/a/b/resolve/main/config.json", client="10.1.2.3")
        request.scope["headers"].append((b"authorization", header))
        with pytest.raises(Unauthorized):
            check_api_key(request, "api_keys", keys)
    api_request = make_request(path="/api/v1/create_session", client="10.1.2.3")  # the Tinker API wants X-API-Key
    api_request.scope["headers"].append((b"authorization", b"Bearer secret-1"))
    with pytest.raises(Unauthorized):
        check_api_key(api_request, "api_keys", keys)
