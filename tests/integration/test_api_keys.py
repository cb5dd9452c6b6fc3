"""API keys issued by the operator's console (`tinker-serve keys`, on the running server's database): used through the
SDK as a named user, described and revoked by `tinker auth`'s calls, revoked by the console, expired; and never
stored in the clear."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import tinker
import yaml
from tinker.cli.auth_api import TinkerAuthApi

from tests.integration.conftest import BASE_MODEL, server_config

KEY_CACHE_S = 2.0  # auth.key_cache_seconds (default): how long another replica may still accept a revoked key


@pytest.fixture(scope="module")
def console(state_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """`tinker-serve ...` against the test server's own database (a Serve config naming the same state_dir)."""
    config = tmp_path_factory.mktemp("console") / "serve_config.yaml"
    app = {"name": "tinker", "import_path": "deployments.builder:build_app", "args": server_config(state_dir)}
    config.write_text(yaml.safe_dump({"applications": [app]}))

    def run(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "app.cli", "--config", str(config), *args],
            capture_output=True,
            text=True,
            check=True,
        )
        return done.stdout.strip()

    return run


def _status(base_url: str, key: str) -> int:
    return httpx.post(f"{base_url}/api/v1/create_session", json={}, headers={"X-API-Key": key}).status_code


def test_issued_key_lifecycle(base_url: str, state_dir: Path, console) -> None:
    secret = console("keys", "create", "--user", "alice-keys", "--name", "laptop")
    assert secret.startswith("tml-")
    service = tinker.ServiceClient(base_url=base_url, api_key=secret)
    try:
        training = service.create_lora_training_client(base_model=BASE_MODEL, rank=4).result()
        run = tinker.RestClient(base_url=base_url, api_key=secret).get_training_run(training.model_id).result()
        assert run.model_owner == "alice-keys"
    finally:
        service.close("success").result()

    with httpx.Client() as http:
        me = TinkerAuthApi(http, base_url=base_url).get_self_api_key(secret)  # what `tinker auth login` checks
    assert (me.name, me.details.user_details.email, me.note.endswith(secret[-4:])) == ("laptop", "alice-keys", True)
    listed = console("keys", "list", "--user", "alice-keys")
    assert "laptop" in listed and "live" in listed and secret not in listed

    console("keys", "revoke", str(me.key_id))
    time.sleep(KEY_CACHE_S + 0.5)
    assert _status(base_url, secret) == 401

    expiring = console("keys", "create", "--user", "alice-keys", "--expires-in-days", str(3 / 86_400))
    assert _status(base_url, expiring) == 200
    time.sleep(3.5)
    assert _status(base_url, expiring) == 401

    stored = b"".join(path.read_bytes() for path in state_dir.glob("tinker_serve.db*"))
    assert secret.encode() not in stored and expiring.encode() not in stored

    # The audit log: the console's issuing and revoking, and the key's use, are Alice's to read; an admin reads them
    # too, and another user does not.
    def events(key: str) -> list[tuple[str, str]]:
        entries = tinker.AdminClient(base_url=base_url, api_key=key).get_audit_log().result().entries
        return [(e.event, str(e.event_details.get("key_id"))) for e in entries]

    alice_now = console("keys", "create", "--user", "alice-keys", "--name", "auditor")
    mine = events(alice_now)
    assert {
        ("apikey_created", str(me.key_id)),
        ("apikey_revoked", str(me.key_id)),
        ("apikey_used", str(me.key_id)),
    } <= set(mine)
    assert set(mine) <= set(events(console("keys", "create", "--user", "ops-admin")))
    assert not {("apikey_created", str(me.key_id))} & set(events("tml-someone-else"))


def test_logout_revokes_the_key_it_presents(base_url: str, console) -> None:
    kept, dropped = (console("keys", "create", "--user", "bob-keys", "--name", n) for n in ("kept", "dropped"))
    with httpx.Client() as http:
        TinkerAuthApi(http, base_url=base_url).delete_self_api_key(dropped)  # what `tinker auth logout` does
    assert _status(base_url, dropped) == 401  # at once on the replica that revoked it
    assert _status(base_url, kept) == 200  # and nothing else


def test_the_sdk_trades_its_key_for_short_lived_tokens(base_url: str, console) -> None:
    """The test server turns auth.jwt_enabled on: client/config tells the SDK, which then sends JWTs from
    /auth/token instead of its key; a forged token gets the challenge the SDK answers by exchanging again."""
    secret = console("keys", "create", "--user", "carol-tokens")
    service = tinker.ServiceClient(base_url=base_url, api_key=secret)
    try:
        training = service.create_lora_training_client(base_model=BASE_MODEL, rank=4).result()
        assert training.get_info().model_id == training.model_id
        assert type(service._get_session_holder()._default_auth).__name__ == "JwtAuthProvider"  # the SDK chose JWTs
    finally:
        service.close("success").result()
    token = httpx.post(f"{base_url}/api/v1/auth/token", json={}, headers={"X-API-Key": secret}).json()["jwt"]
    assert _status(base_url, token) == 200
    header, payload, _ = token.split(".")
    forged = httpx.post(f"{base_url}/api/v1/create_session", json={}, headers={"X-API-Key": f"{header}.{payload}.x"})
    assert forged.status_code == 401 and 'error="invalid_token"' in forged.headers["www-authenticate"]


def test_admins_manage_keys_over_rest(base_url: str, console) -> None:
    """Users named in auth.admin_users (the test server's: ops-admin) do over REST what the console does."""
    admin = {"X-API-Key": console("keys", "create", "--user", "ops-admin", "--name", "rest")}
    with httpx.Client(base_url=f"{base_url}/api/v1/admin", timeout=30, headers=admin) as http:
        made = http.post("/keys", json={"user": "dave-rest", "name": "ci", "expires_in_days": 1}).json()
        assert (made["user"], made["name"], made["hint"]) == ("dave-rest", "ci", made["key"][-4:])
        assert _status(base_url, made["key"]) == 200
        listed = http.get("/keys", params={"owner": "dave-rest"}).json()["keys"]
        assert [k["key_id"] for k in listed] == [made["key_id"]] and "key" not in listed[0]
        assert "dave-rest" in {u["name"] for u in http.get("/users").json()["users"]}
        assert http.delete(f"/keys/{made['key_id']}").json()["revoked_at"] is not None
        assert http.delete("/keys/999999").status_code == 404
    assert _status(base_url, made["key"]) == 401  # at once on the replica that revoked it
    refused = httpx.get(f"{base_url}/api/v1/admin/keys", headers={"X-API-Key": made["key"].replace("tml-", "tml-x")})
    assert refused.status_code == 403 and "auth.admin_users" in refused.json()["error"]
