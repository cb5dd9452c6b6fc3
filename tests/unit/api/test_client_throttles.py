"""What one client address may cost the others (app.api.gate, app.api.auth.client_address): refused keys are
throttled per address without ever refusing a key that authenticates; behind a trusted proxy the address is the one
it forwarded for; signed links and key-less /hub requests are charged to a rate per address; the /hub routes hash a
base's files once, not per request."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from pydantic import ValidationError
from starlette.requests import Request

from app.api.auth import client_address
from app.api.key_index import KeyIndex
from app.config import AuthConfig, ServerConfig
from app.db.checkpoints import CheckpointRecord
from app.db.keys import key_hash
from app.storage.paths import CheckpointPath
from tests.unit.api.conftest import BASE_MODEL, InProcessApi, saved_checkpoint


def _with_auth(api: InProcessApi, **auth: Any) -> None:
    config = api.services.config
    api.services.config = config.model_copy(update={"auth": config.auth.model_copy(update=auth)})


def test_refused_keys_never_lock_out_a_valid_key_from_their_address(
    make_api: Callable[..., InProcessApi], monkeypatch: pytest.MonkeyPatch
) -> None:
    """601 junk keys through one NAT or proxy used to answer every valid key from there 429. Past the budget a
    refused key answers 429 and costs no key-store lookup (made-up keys are not in the key index); keys that exist,
    configured or issued a moment ago, are still accepted from that address."""
    api = make_api(failed_auth_per_minute_per_client=3)
    api.services.auth = replace(api.services.auth, mode="api_keys", configured=frozenset({"tml-valid"}))
    lookups: Counter[str] = Counter()
    find = api.services.auth.keys.find

    async def counted(secret: str) -> Any:
        lookups[secret] += 1
        return await find(secret)

    monkeypatch.setattr(api.services.auth.keys, "find", counted)

    def status(key: str) -> int:
        return int(api.client.post("/api/v1/create_session", json={}, headers={"X-API-Key": key}).status_code)

    assert [status("tml-junk") for _ in range(5)] == [401, 401, 401, 429, 429]
    assert api.post("/api/v1/create_session", {"tags": []}, user="valid").status_code == 200
    assert status("tml-junk2") == 429 and lookups["tml-junk"] == 3 and "tml-junk2" not in lookups
    issued, _ = api.run(api.services.auth.keys.issue("carol", "laptop"))  # after the key index was read
    assert status(issued) == 200


def _request(peer: str, forwarded: list[str]) -> Request:
    headers = [(b"x-forwarded-for", value.encode()) for value in forwarded]
    return Request({"type": "http", "method": "GET", "path": "/", "headers": headers, "client": (peer, 5000)})


@pytest.mark.parametrize(
    ("peer", "forwarded", "client"),
    [
        ("10.0.0.5", ["203.0.113.9"], "203.0.113.9"),
        ("10.0.0.5", ["198.51.100.1, 203.0.113.9"], "203.0.113.9"),  # the left one is what the client claimed
        ("10.0.0.5", ["203.0.113.9, 10.0.0.7"], "203.0.113.9"),  # a chain of trusted proxies
        ("10.0.0.5", ["198.51.100.1", "203.0.113.9"], "203.0.113.9"),  # one header per hop
        ("10.0.0.5", ["10.0.0.6, 10.0.0.7"], "10.0.0.6"),  # all trusted: the farthest
        ("10.0.0.5", [], "10.0.0.5"),
        ("192.0.2.1", ["203.0.113.9"], "192.0.2.1"),  # not a trusted proxy: its header is ignored
    ],
)
def test_the_client_is_the_right_most_untrusted_forwarded_address(peer: str, forwarded: list[str], client: str) -> None:
    assert client_address(_request(peer, forwarded), ["10.0.0.0/24"]) == client
    assert client_address(_request(peer, forwarded), []) == peer


def test_trusted_proxies_are_addresses_or_networks() -> None:
    assert AuthConfig(trusted_proxies=["10.0.0.5", "10.1.0.0/16", "fd00::/8"]).trusted_proxies[2] == "fd00::/8"
    with pytest.raises(ValidationError, match=r"auth\.trusted_proxies: 'haproxy' is not an IP address or CIDR"):
        AuthConfig(trusted_proxies=["haproxy"])


def test_a_trusted_proxys_clients_are_throttled_apart(make_api: Callable[..., InProcessApi]) -> None:
    api = make_api(failed_auth_per_minute_per_client=2)
    bad = {"X-API-Key": "bad"}

    def refusals(forwarded_for: str) -> list[int]:
        headers = {**bad, "X-Forwarded-For": forwarded_for}
        return [api.client.post("/api/v1/create_session", json={}, headers=headers).status_code for _ in range(3)]

    _with_auth(api, trusted_proxies=["127.0.0.1"])  # the test client's address
    assert refusals("203.0.113.1") == [401, 401, 429]
    assert refusals("203.0.113.2") == [401, 401, 429]  # another client behind the same proxy
    _with_auth(api, trusted_proxies=["10.0.0.0/8"])  # the peer is not a proxy: X-Forwarded-For is ignored
    assert refusals("203.0.113.3") == [401, 401, 429]
    assert refusals("203.0.113.4") == [429, 429, 429]


def _signed_link(api: InProcessApi) -> str:
    """The path and query of a signed download link to a one-byte file of alice's."""
    model_id = saved_checkpoint(api, "alice").model_id
    path = CheckpointPath(model_id, "external_weights", "e1")
    location = path.new_location()
    api.services.storage.write(location, lambda out: (out.mkdir(parents=True), (out / "a.bin").write_bytes(b"w")))
    api.run(api.services.checkpoints.commit(CheckpointRecord(path, location, 1, time.time()), overwrite=False))
    route = f"/api/v1/training_runs/{model_id}/checkpoints/external_weights/e1/external_weights_urls"
    url = urlsplit(api.get(route).json()["urls"]["a.bin"])
    return f"{url.path}?{url.query}"


def test_signed_links_and_keyless_hub_requests_are_charged_per_client(make_api: Callable[..., InProcessApi]) -> None:
    api = make_api(keyless_requests_per_minute_per_client=3)
    link = _signed_link(api)
    assert [api.client.get(link).status_code for _ in range(2)] == [200, 200]
    assert api.client.get("/hub/api/models/unknown").status_code == 404  # key-less on loopback: the same rate
    past = api.client.get(link)
    assert past.status_code == 429 and int(past.headers["retry-after"]) >= 1
    assert "quotas.keyless_requests_per_minute_per_client=3" in past.json()["error"]
    assert api.get("/hub/api/models/unknown").status_code == 404  # with a key: the key's own rate


def test_hub_routes_hash_a_bases_files_once(api: InProcessApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tmp_path / "tiny"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "tokenizer.json").write_text('{"v": 1}')
    config = api.services.config
    api.services.config = ServerConfig(base_models=[{"name": BASE_MODEL, "path": str(model)}], auth=config.auth)
    reads: Counter[str] = Counter()
    read_bytes = Path.read_bytes

    def counted(path: Path) -> bytes:
        reads[path.name] += 1
        return read_bytes(path)

    monkeypatch.setattr(Path, "read_bytes", counted)

    def listing() -> dict[str, Any]:
        files = api.get(f"/hub/api/models/{BASE_MODEL}/tree/main").json()
        return {f["path"]: (f["size"], f["oid"]) for f in files}

    first = listing()
    reads.clear()
    assert listing() == first and api.get(f"/hub/api/models/{BASE_MODEL}").status_code == 200
    assert reads == Counter()  # unchanged files: neither read nor hashed again
    (model / "tokenizer.json").write_text('{"v": 22}')
    assert listing()["tokenizer.json"][0] == 9  # a changed file is read again


def test_a_flood_of_made_up_keys_reads_the_key_store_once() -> None:
    """However many unknown keys are asked about at once, they wait for one read that began after they asked."""

    class Keys:
        reads = 0

        async def hashes(self) -> set[str]:
            Keys.reads += 1
            await asyncio.sleep(0.01)
            return {key_hash("tml-issued")}

    async def ask() -> list[bool]:
        index = KeyIndex(Keys(), frozenset({"tml-configured"}))  # type: ignore[arg-type]
        keys = [f"tml-junk{i}" for i in range(200)] + ["tml-issued", "tml-configured"]
        return list(await asyncio.gather(*(index.exists(k) for k in keys)))

    answers = asyncio.run(ask())
    assert Keys.reads == 1 and answers == [False] * 200 + [True, True]
