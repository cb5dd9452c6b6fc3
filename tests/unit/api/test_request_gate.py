"""What the app refuses before it reads a body or holds a slot (app.api.gate, app.api.quotas), through the in-process
app (tests/unit/api/conftest.py): bodies of unauthenticated or oversized requests are never read; the loopback mode
answers only requests addressed to this machine; refused keys are throttled per client; a user's long-polls,
pending bytes and live models are bounded; get_info shows no server path; another user's download links end when
the checkpoint is unpublished."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pytest
from pydantic import ValidationError

from app.api.quotas import check_pending_requests
from app.api.training import sequenced
from app.config import EngineConfig, QuotasConfig, ServerConfig
from app.db.checkpoints import CheckpointRecord
from app.db.futures import PROTO_CONTENT_TYPE
from app.db.metadata import TrainingRun
from app.errors import LimitExceeded
from app.messages import SequencedOp, Skip
from app.protocol.results import encode_forward_backward_output
from app.storage.paths import CheckpointPath
from app.training_data.batch import ForwardBackwardResult
from tests.unit.api.conftest import InProcessApi, saved_checkpoint
from tests.unit.api.test_hostile_inputs import refused


def _raw_post(api: InProcessApi, path: str, headers: dict[str, str], body: bytes | None) -> tuple[int, int]:
    """POST straight into the ASGI app: (status, how many times the app asked for the body). `body` None: sent
    without a Content-Length, in 64 KiB chunks."""
    reads = 0
    chunks = [body] if body is not None else [b"x" * 65536] * 64  # 4 MiB, chunked
    raw_headers = [(b"host", b"127.0.0.1:8000"), *((k.lower().encode(), v.encode()) for k, v in headers.items())]
    if body is not None:
        raw_headers.append((b"content-length", str(len(body)).encode()))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": raw_headers,
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8000),
    }

    async def receive() -> dict[str, Any]:
        nonlocal reads
        reads += 1
        if reads <= len(chunks):
            return {"type": "http.request", "body": chunks[reads - 1], "more_body": reads < len(chunks)}
        return {"type": "http.disconnect"}

    status = 0

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    async def call() -> None:
        await api.client.app(scope, receive, send)  # type: ignore[arg-type]

    api.run(call())
    return status, reads


def test_bodies_are_never_read_without_a_key_nor_past_their_cap(api: InProcessApi) -> None:
    big = b"{" + b" " * (3 * 2**20) + b"}"  # 3 MiB of JSON to a control route (limit 1 MiB)
    assert _raw_post(api, "/api/v1/create_session", {"x-api-key": "not-a-tml-key"}, big) == (401, 0)
    assert _raw_post(api, "/api/v1/create_session", {"x-api-key": "tml-alice"}, big) == (413, 0)
    status, reads = _raw_post(api, "/api/v1/create_session", {"x-api-key": "tml-alice"}, None)  # chunked
    assert status == 413 and reads == 2**20 // 65536 + 1  # read only until it passed the cap
    body = api.post("/api/v1/create_session", {"tags": ["x" * (2**20)]})
    assert refused(body, "body", 413)["error"].endswith("limits.max_control_request_bytes=1048576 bytes")
    json_key = {"x-api-key": "tml-alice", "content-type": "application/json"}
    assert _raw_post(api, "/api/v1/create_session", json_key, b'{"tags": []}')[0] == 200


@pytest.mark.parametrize(
    ("headers", "field"),
    [
        ({"Host": "attacker.example"}, "host"),
        ({"Host": "127.0.0.1.attacker.example:8000"}, "host"),
        ({"Origin": "http://attacker.example"}, "origin"),
        ({"Origin": "null"}, "origin"),
    ],
)
def test_the_loopback_mode_answers_only_this_machine(api: InProcessApi, headers: dict, field: str) -> None:
    """A page of another site whose name was rebound to 127.0.0.1 (DNS rebinding) sends its own name."""
    refused(api.client.post("/api/v1/create_session", json={}, headers={**api.headers(), **headers}), field, 403)


@pytest.mark.parametrize("host", ["127.0.0.1:8000", "localhost:8000", "[::1]:8000", "localhost", "127.0.0.2"])
def test_local_names_are_this_machine(api: InProcessApi, host: str) -> None:
    headers = {**api.headers(), "Host": host, "Origin": f"http://{host}"}
    assert api.client.post("/api/v1/create_session", json={}, headers=headers).status_code == 200


def test_refused_keys_are_throttled_per_client(make_api: Callable[..., InProcessApi]) -> None:
    api = make_api(failed_auth_per_minute_per_client=5)
    for _ in range(5):
        assert api.client.post("/api/v1/create_session", json={}, headers={"X-API-Key": "bad"}).status_code == 401
    throttled = api.client.post("/api/v1/create_session", json={}, headers={"X-API-Key": "bad"})
    assert throttled.status_code == 429 and int(throttled.headers["retry-after"]) >= 1
    assert "quotas.failed_auth_per_minute_per_client" in throttled.json()["error"]


def _pending_future(api: InProcessApi, user: str = "alice") -> tuple[str, str]:
    """(model id, request id) of a pending training operation of a run of `user`'s."""
    model_id = saved_checkpoint(api, user).model_id
    request_id, _ = api.run(api.services.futures.create("optim_step", model_id, 1))
    return model_id, request_id


def test_long_polls_are_bounded_per_user(make_api: Callable[..., InProcessApi]) -> None:
    api = make_api(max_long_polls_per_user=1, long_poll_seconds=3)
    _, request_id = _pending_future(api)
    answers: list[Any] = []
    waiting = threading.Thread(
        target=lambda: answers.append(api.post("/api/v1/retrieve_future", {"request_id": request_id}))
    )
    waiting.start()
    time.sleep(1)  # the first long-poll holds the user's one slot
    second = api.post("/api/v1/retrieve_future", {"request_id": request_id})
    assert second.status_code == 429 and "quotas.max_long_polls_per_user" in second.json()["error"]
    _, bobs = _pending_future(api, "bob")
    started = time.monotonic()
    assert api.post("/api/v1/retrieve_future", {"request_id": bobs}, user="bob").json()["type"] == "try_again"
    assert time.monotonic() - started > 2  # bob's waited: his own slot
    waiting.join()
    assert answers[0].json()["type"] == "try_again"
    assert api.services.long_polls == {}  # every slot given back


def _forward_backward(model_id: str, seq_id: int, datums: int) -> dict:
    datum = {
        "model_input": {"chunks": [{"type": "encoded_text", "tokens": list(range(1, 257))}]},
        "loss_fn_inputs": {"target_tokens": {"data": list(range(2, 258)), "dtype": "int64", "shape": [256]}},
    }
    return {
        "model_id": model_id,
        "seq_id": seq_id,
        "forward_backward_input": {"data": [datum] * datums, "loss_fn": "cross_entropy"},
    }


def test_pending_bytes_are_bounded_per_user(make_api: Callable[..., InProcessApi]) -> None:
    """The batches a user has waiting are held in the ingress, the trainer and the journal: bounded in bytes."""
    api = make_api(max_pending_bytes_per_user=64 * 1024)
    model_id, _ = _pending_future(api)
    too_big = api.post("/api/v1/forward_backward", _forward_backward(model_id, 5, 64))  # 64 x 256 x 16 bytes
    assert refused(too_big, "data")["error"].count("quotas.max_pending_bytes_per_user") == 1
    held = Skip("r" * 60_000)  # a pending operation whose journal row holds ~60 KB
    request_id, _ = api.run(api.services.futures.create("optim_step", model_id, 2))
    api.run(api.services.journal.append(model_id, 2, Skip(request_id)))
    api.run(api.services.journal.append(model_id, 3, held))
    api.run(api.services.futures.create("optim_step", model_id, 3))
    queued = api.post("/api/v1/forward_backward", _forward_backward(model_id, 6, 4))  # 16 KiB more: over
    assert queued.status_code == 429 and "quotas.max_pending_bytes_per_user" in queued.json()["error"]
    assert int(queued.headers["retry-after"]) >= 1


def test_a_user_of_their_own_quotas_is_held_to_them(make_api: Callable[..., InProcessApi]) -> None:
    bob = InProcessApi.user_id("bob")
    api = make_api(max_pending_bytes_per_user=64 * 1024, users={bob: {"max_pending_bytes_per_user": 2**20}})
    alices, _ = _pending_future(api)
    bobs, _ = _pending_future(api, "bob")
    batch = _forward_backward(alices, 5, 64)  # 256 KiB decoded
    assert (
        "quotas.max_pending_bytes_per_user=65536"
        in refused(api.post("/api/v1/forward_backward", batch), "data")["error"]
    )
    api.run(check_pending_requests(api.services, bob, bobs, 5, nbytes=256 * 1024))  # within bob's own MiB
    with pytest.raises(LimitExceeded, match="max_pending_bytes_per_user=1048576"):
        api.run(check_pending_requests(api.services, bob, bobs, 5, nbytes=2 * 2**20))


def test_one_user_cannot_fill_a_trainer() -> None:
    match = "quotas.max_live_models_per_user 64 must be below engine.max_models_per_base 64"
    with pytest.raises(ValidationError, match=match):
        ServerConfig(
            base_models=[{"name": "m", "path": "models/m"}],
            quotas={"max_live_models_per_user": 64},
            engine={"max_models_per_base": 64},
        )
    assert QuotasConfig().max_live_models_per_user < EngineConfig().max_models_per_base


def test_get_info_shows_no_server_path(api: InProcessApi) -> None:
    model_id = saved_checkpoint(api, "alice").model_id
    info = api.post("/api/v1/get_info", {"model_id": model_id}).json()
    assert info["model_data"]["tokenizer_id"] == "tiny"  # the served name, not its path (models/tiny)
    assert "models/" not in str(info)


def test_another_users_download_links_end_at_unpublish(api: InProcessApi) -> None:
    model_id = saved_checkpoint(api, "bob").model_id  # a run of bob's
    path = CheckpointPath(model_id, "external_weights", "e1")
    location = path.new_location()

    def export(out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "a.bin").write_bytes(b"w")

    api.services.storage.write(location, export)
    api.run(api.services.checkpoints.commit(CheckpointRecord(path, location, 1, time.time()), overwrite=False))
    route = f"/api/v1/training_runs/{model_id}/checkpoints/external_weights/e1"
    assert api.client.post(f"{route}/publish", headers=api.headers("bob")).status_code == 200

    def link(user: str) -> str:
        url = api.get(f"{route}/external_weights_urls", user=user).json()["urls"]["a.bin"]
        parts = urlsplit(url)
        return f"{parts.path}?{parts.query}"

    alices, bobs = link("alice"), link("bob")
    assert "grant=public" in alices and "grant" not in bobs
    assert api.client.get(alices).content == b"w"
    forged = alices.replace("grant=public", "grant=owner")
    refused(api.client.get(forged), "signature", 403)
    assert api.client.delete(f"{route}/publish", headers=api.headers("bob")).status_code == 200
    refused(api.client.get(alices), "grant", 403)
    assert api.client.get(bobs).content == b"w"  # the owner's own link lasts until it expires


def test_a_failure_preparing_an_operation_fails_its_future(api: InProcessApi) -> None:
    """Any exception while an operation is prepared fails its future and lets the model's order go on: a retry of
    the same seq_id finds the failed future, never a pending one."""
    model_id = saved_checkpoint(api, "alice").model_id
    submitted: list[tuple] = []
    api.services.trainers = SimpleNamespace(submit=lambda *args: submitted.append(args))  # type: ignore[assignment]

    async def broken(request_id: str, run: TrainingRun) -> SequencedOp:
        raise RuntimeError("too many SQL variables")

    def send() -> dict:
        return api.run(sequenced(api.services, api.user_id(), "forward_backward", model_id, 1, broken))

    first = send()
    failed = api.post("/api/v1/retrieve_future", {"request_id": first["request_id"]}).json()
    assert failed["category"] == "server" and "too many SQL variables" in failed["error"]
    assert [type(args[3]) for args in submitted] == [Skip]  # the trainer skips the seq_id
    assert send()["request_id"] == first["request_id"]


def test_old_sdks_read_a_non_finite_loss(api: InProcessApi) -> None:
    """Results are JSON for SDKs before protobuf results; an infinite loss is JSON's Infinity, as Python writes it."""
    model_id = saved_checkpoint(api, "alice").model_id
    request_id, _ = api.run(api.services.futures.create("forward_backward", model_id, 1))
    logprobs = np.array([-np.inf, -0.5], dtype=np.float32)
    result = ForwardBackwardResult(np.array([0, 2]), {"logprobs": logprobs}, {"loss:sum": float("inf")})
    api.run(api.services.futures.complete(request_id, encode_forward_backward_output(result), PROTO_CONTENT_TYPE))
    answer = api.post("/api/v1/retrieve_future", {"request_id": request_id})
    assert answer.status_code == 200
    body = json.loads(answer.text)
    assert body["metrics"]["loss:sum"] == math.inf
    assert body["loss_fn_outputs"][0]["logprobs"]["data"] == [-math.inf, -0.5]


def test_forward_backward_seq_id_beyond_int64(api: InProcessApi) -> None:
    model_id = saved_checkpoint(api, "alice").model_id
    refused(api.post("/api/v1/forward_backward", _forward_backward(model_id, 2**63, 1)), "seq_id")
