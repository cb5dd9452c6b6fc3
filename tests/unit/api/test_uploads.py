"""Uploading an adapter trained elsewhere (app.api.uploads), over HTTP in process: the wire shapes of Tinker 0.39/0.40
(external_weights_upload_start's `urls` of `{url, headers}`, a PUT per file sending those headers, finish's
`tinker_path`), and each way a PUT or an upload is refused."""

from __future__ import annotations

import json
import pickle
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import httpx
import numpy as np
import pytest
from safetensors.numpy import save

from app.api import uploads as uploads_module
from app.api.adapter_files import max_sizes
from app.api.signatures import sign
from app.config import UploadsConfig
from app.models.adapter_layout import lora_tensors
from app.storage.objects import ObjectStorage
from app.storage.paths import parse_tinker_path
from tests.s3 import s3_keys, s3_server
from tests.unit.api.conftest import BASE_MODEL, InProcessApi

RANK = 4
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
START = "/api/v1/external_weights_upload_start"
FINISH = "/api/v1/external_weights_upload_finish"


def _tensors(rank: int = RANK, dtype: Any = np.float32) -> dict[str, np.ndarray]:
    config = json.loads(Path("models/tiny/config.json").read_text())
    return {name: np.full(shape, 0.01, dtype) for name, shape in lora_tensors(config, rank, True, True).items()}


def _config(**changes: Any) -> bytes:
    config = {"peft_type": "LORA", "r": RANK, "lora_alpha": 16, "target_modules": TARGETS, "bias": "none"}
    return json.dumps({**config, **changes}).encode()


def _start(api: InProcessApi, user: str = "alice", **lora: Any) -> Any:
    return api.post(START, {"base_model": BASE_MODEL, "lora_config": {"rank": RANK, **lora}}, user)


def _put(api: InProcessApi, target: dict, body: bytes | Iterator[bytes], **headers: str) -> Any:
    url = urlsplit(target["url"])
    sent = {**target["headers"], **headers}
    return api.client.put(f"{url.path}?{url.query}", content=body, headers={k: v for k, v in sent.items() if v})


def _upload(api: InProcessApi, weights: bytes, config: bytes | None = None, user: str = "alice") -> Any:
    """Start, PUT both files with the returned headers, finish: the finish's response."""
    started = _start(api, user)
    assert started.status_code == 200, started.text
    urls = started.json()["urls"]
    for name, body in (("adapter_config.json", config or _config()), ("adapter_model.safetensors", weights)):
        assert _put(api, urls[name], body).status_code == 200
    return api.post(FINISH, {"upload_id": started.json()["upload_id"]}, user)


def test_an_adapter_is_put_with_the_returned_headers_and_finishes_as_the_callers_training_checkpoint(
    api: InProcessApi,
) -> None:
    started = _start(api)
    assert started.status_code == 200, started.text
    body = started.json()
    assert set(body) == {"upload_id", "urls", "expires"}
    assert set(body["urls"]) == {"adapter_config.json", "adapter_model.safetensors"}
    assert all(set(u) == {"url", "headers"} for u in body["urls"].values())
    assert body["urls"]["adapter_model.safetensors"]["headers"] == {"Content-Type": "application/octet-stream"}
    for name, content in (("adapter_config.json", _config()), ("adapter_model.safetensors", save(_tensors()))):
        assert _put(api, body["urls"][name], content).status_code == 200
    assert api.post(FINISH, {"upload_id": body["upload_id"]}, "bob").json()["field"] == "upload_id"
    finished = api.post(FINISH, {"upload_id": body["upload_id"]})
    assert finished.status_code == 200, finished.text
    path = parse_tinker_path(finished.json()["tinker_path"])
    assert path.kind == "weights"
    assert api.post(FINISH, {"upload_id": body["upload_id"]}).json() == finished.json()  # a retry
    record, run = api.run(api.services.saved_by(path.uri, api.user_id(), field="path"))
    assert (run.base_model, run.lora_config["rank"], run.lora_config["alpha"]) == (BASE_MODEL, RANK, 16.0)
    stored = {f.relative_path for f in api.services.storage.files(record.location)}
    assert stored == {"adapter_config.json", "adapter_model.safetensors", "tinker_model.json"}
    with pytest.raises(Exception, match="no training run"):
        api.run(api.services.saved_by(path.uri, api.user_id("bob"), field="path"))


def test_another_users_upload_id_answers_as_a_missing_one(api: InProcessApi) -> None:
    upload_id = _start(api).json()["upload_id"]
    theirs, missing = (api.post(FINISH, {"upload_id": u}, "bob") for u in (upload_id, "upload-nope"))
    assert theirs.status_code == missing.status_code == 404
    assert theirs.json()["error"].replace(upload_id, "X") == missing.json()["error"].replace("upload-nope", "X")


def test_a_put_without_the_returned_content_type_or_with_another_is_refused(api: InProcessApi) -> None:
    target = _start(api).json()["urls"]["adapter_config.json"]
    for content_type in ("", "text/plain"):
        refused = _put(api, target, _config(), **{"Content-Type": content_type})
        assert refused.status_code == 400
        assert refused.json()["field"] == "content-type"


def test_a_put_with_a_wrong_signature_or_past_its_expiry_is_refused(api: InProcessApi) -> None:
    upload_id = _start(api).json()["upload_id"]
    headers = {"Content-Type": "application/octet-stream"}
    past = int(time.time()) - 1
    signature = sign(api.services.url_signing_key, f"upload/{upload_id}/adapter_config.json", past)
    url = f"/api/v1/uploads/{upload_id}/adapter_config.json"
    expired = api.client.put(f"{url}?expires={past}&signature={signature}", content=b"{}", headers=headers)
    assert (expired.status_code, expired.json()["field"]) == (403, "expires")
    forged = api.client.put(f"{url}?expires={past + 9999}&signature={signature}", content=b"{}", headers=headers)
    assert (forged.status_code, forged.json()["field"]) == (403, "signature")


def test_a_body_over_its_files_bound_is_refused_declared_or_streamed(api: InProcessApi) -> None:
    target = _start(api).json()["urls"]["adapter_config.json"]
    cap = UploadsConfig().max_config_bytes
    assert _put(api, target, b" " * (cap + 1)).status_code == 413
    streamed = _put(api, target, iter([b" " * cap, b" "]))  # chunked: no Content-Length
    assert streamed.status_code == 413
    assert _put(api, target, b" " * cap).status_code == 200


@pytest.mark.parametrize(
    ("weights", "refusal"),
    [
        (pickle.dumps({"a": 1}), "not a safetensors file"),
        (b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all", "not JSON"),
        (save(_tensors(rank=2)), "has shape"),
        (save({**_tensors(), "extra.weight": np.zeros((1, 1), np.float32)}), "unexpected"),
        (save(_tensors(dtype=np.int32)), "adapters may be"),
        (save(_tensors())[:-4], "holds"),
    ],
    ids=["pickle", "bad-header", "wrong-rank", "extra-tensor", "int-dtype", "truncated"],
)
def test_finish_refuses_weights_that_are_not_the_adapter_declared(
    api: InProcessApi, weights: bytes, refusal: str
) -> None:
    refused = _upload(api, weights)
    assert refused.status_code == 400, refused.text
    assert refused.json()["field"] == "files.adapter_model.safetensors"
    assert refusal in refused.json()["error"]


def test_finish_refuses_a_config_of_another_rank_or_targets_and_a_missing_file(api: InProcessApi) -> None:
    for config, field in ((_config(r=8), "r"), (_config(target_modules=["q_proj"]), "target_modules")):
        refused = _upload(api, save(_tensors()), config)
        assert refused.json()["field"] == f"files.adapter_config.json.{field}", refused.text
    upload_id = _start(api).json()["upload_id"]
    missing = api.post(FINISH, {"upload_id": upload_id})
    assert (missing.status_code, missing.json()["field"]) == (400, "files.adapter_config.json")


def test_start_refuses_what_the_server_cannot_train_and_sample(api: InProcessApi) -> None:
    over = _start(api, rank=api.services.config.engine.max_lora_rank + 1)
    assert (over.status_code, over.json()["field"]) == (400, "lora_config.rank")
    nothing = _start(api, train_attn=False, train_mlp=False)
    assert nothing.json()["field"] == "lora_config"
    unknown = api.post(START, {"base_model": "nope", "lora_config": {"rank": RANK}})
    assert unknown.json()["field"] == "base_model"


def test_an_upload_holds_its_bytes_of_the_checkpoint_quota_from_its_start(make_api: Any) -> None:
    config, shapes = UploadsConfig(), {name: t.shape for name, t in _tensors().items()}
    held = sum(max_sizes(shapes, config.max_config_bytes, config.max_header_bytes).values())
    api = make_api(max_checkpoint_bytes_per_user=held * 3 // 2)
    first = _start(api)
    assert first.status_code == 200
    assert api.run(api.services.quotas.checkpoint_bytes(api.user_id())) == held
    refused = _start(api)
    assert refused.status_code == 400
    assert "quotas.max_checkpoint_bytes_per_user" in refused.json()["error"]
    assert _start(api, "bob").status_code == 200


def test_uploads_turned_off_are_refused(api: InProcessApi) -> None:
    api.services.config = api.services.config.model_copy(update={"uploads": UploadsConfig(enabled=False)})
    refused = _start(api)
    assert (refused.status_code, refused.json()["field"]) == (403, "uploads.enabled")
    assert api.post(FINISH, {"upload_id": "upload-x"}).status_code == 403


def test_an_unfinished_upload_expires_with_its_files(api: InProcessApi, monkeypatch: pytest.MonkeyPatch) -> None:
    started = _start(api).json()
    assert _put(api, started["urls"]["adapter_config.json"], _config()).status_code == 200
    upload = api.run(api.services.uploads.find(started["upload_id"]))
    assert api.services.storage.files(upload.location)
    later = time.time() + api.services.config.uploads.url_ttl_seconds + 1
    monkeypatch.setattr(uploads_module, "time", SimpleNamespace(time=lambda: later))
    assert api.run(uploads_module.expire_uploads(api.services)) == 1
    with pytest.raises(FileNotFoundError):
        api.services.storage.files(upload.location)
    assert api.run(api.services.uploads.find(started["upload_id"])) is None
    assert api.run(api.services.quotas.checkpoint_bytes(api.user_id())) == 0


def test_on_s3_storage_the_urls_are_presigned_puts_to_the_bucket(api: InProcessApi) -> None:
    with s3_server("uploads") as uri:
        api.services.storage = ObjectStorage(uri)
        started = _start(api).json()
        endpoint = dict(parse_qsl(urlsplit(uri).query))["endpoint_override"]
        for name, content in (("adapter_config.json", _config()), ("adapter_model.safetensors", save(_tensors()))):
            target = started["urls"][name]
            assert urlsplit(target["url"]).netloc == endpoint and "Signature=" in target["url"]
            for wrong in ({}, {"Content-Type": "text/plain"}):  # the content type is signed: S3 refuses others
                assert httpx.put(target["url"], content=content, headers=wrong).status_code == 403
            httpx.put(target["url"], content=content, headers=target["headers"]).raise_for_status()
        finished = api.post(FINISH, {"upload_id": started["upload_id"]})
        assert finished.status_code == 200, finished.text
        record, _ = api.run(api.services.saved_by(finished.json()["tinker_path"], api.user_id(), field="path"))
        assert {f.relative_path for f in api.services.storage.files(record.location)} == {
            "adapter_config.json",
            "adapter_model.safetensors",
            "tinker_model.json",
        }
        assert s3_keys(uri, "uploads") == []  # the upload's own files are gone


def test_an_sdk_before_0_40_gets_plain_urls_it_puts_without_our_headers(api: InProcessApi) -> None:
    """0.39's `urls` were plain strings; its PUTs send no headers of ours. Only such URLs take any content type."""
    sdk_039 = {"X-Stainless-Package-Version": "0.39.0"}
    body = {"base_model": BASE_MODEL, "lora_config": {"rank": RANK}}
    started = api.post(START, body, headers=sdk_039).json()
    assert all(isinstance(url, str) for url in started["urls"].values())
    for name, content in (("adapter_config.json", _config()), ("adapter_model.safetensors", save(_tensors()))):
        url = urlsplit(started["urls"][name])
        assert api.client.put(f"{url.path}?{url.query}", content=content).status_code == 200
    assert api.post(FINISH, {"upload_id": started["upload_id"]}).status_code == 200
    target = _start(api).json()["urls"]["adapter_config.json"]  # a 0.40 URL cannot be made to take any type
    refused = _put(api, {**target, "url": f"{target['url']}&any_type=true"}, _config(), **{"Content-Type": ""})
    assert (refused.status_code, refused.json()["field"]) == (403, "signature")
