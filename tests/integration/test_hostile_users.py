"""Hostile requests through the real Serve app, and another user's training going on meanwhile: a large body without
a valid key is refused before the ingress reads it (its memory stays flat), an oversized one with a key is 413, a
page of another site rebound to 127.0.0.1 is refused, and a bomb of sparse loss inputs is refused at its shape."""

from __future__ import annotations

import httpx
import numpy as np
import psutil
import tinker
from ray.util.state import list_actors
from tinker import types

from tests.integration.conftest import BASE_MODEL
from tests.integration.helpers import future_result, new_client, raw_client

BODY_BYTES = 48 * 2**20  # on a control route (limit 1 MiB), and under forward_backward's 64 MiB


def _ingress_rss() -> int:
    (ingress,) = list_actors(filters=[("class_name", "=", "ServeReplica:tinker:Ingress"), ("state", "=", "ALIVE")])
    return psutil.Process(ingress.pid).memory_info().rss


def test_hostile_requests_are_refused_before_they_cost(base_url: str, service_client: tinker.ServiceClient) -> None:
    worker = new_client(service_client, seed=31)
    data = [
        types.Datum(
            model_input=types.ModelInput.from_ints(list(range(3, 19))),
            loss_fn_inputs={"target_tokens": types.TensorData.from_numpy(np.arange(4, 20, dtype=np.int64))},
        )
    ]
    worker.forward_backward(data, "cross_entropy").result()  # the other user's training, before and after
    body = b'{"tags": ["' + b"x" * BODY_BYTES + b'"]}'
    before = _ingress_rss()
    with httpx.Client(base_url=base_url, timeout=60) as http:
        keyless = http.post("/api/v1/create_session", content=body, headers={"X-API-Key": "not-a-key"})
        assert keyless.status_code == 401 and keyless.json()["category"] == "user"
        assert http.post("/api/v1/forward_backward", content=body, headers={"X-API-Key": "bad"}).status_code == 401
        too_large = http.post("/api/v1/create_session", content=body, headers={"X-API-Key": "tml-hostile"})
        assert too_large.status_code == 413 and too_large.json()["field"] == "body"
        assert "limits.max_control_request_bytes" in too_large.json()["error"]
        rebound = http.post(
            "/api/v1/create_session", json={}, headers={"X-API-Key": "tml-hostile", "Host": "attacker.example"}
        )
        assert rebound.status_code == 403 and rebound.json()["field"] == "host"
    grown = _ingress_rss() - before
    assert grown < 32 * 2**20, f"the ingress grew {grown / 2**20:.0f} MiB on bodies it should not have read"

    with raw_client(base_url, "tml-hostile") as http:  # one-token datums, each a [1, 2**26] sparse weight tensor
        session = http.post("/api/v1/create_session", json={}).json()["session_id"]
        model = {"session_id": session, "model_seq_id": 0, "base_model": BASE_MODEL, "lora_config": {"rank": 4}}
        model_id = future_result(http, http.post("/api/v1/create_model", json=model).json()["request_id"])
        sparse = {"data": [], "dtype": "float32", "shape": [1, 2**26], "sparse_crow_indices": [0, 0]}
        sparse["sparse_col_indices"] = []
        datum = {
            "model_input": {"chunks": [{"type": "encoded_text", "tokens": [5]}]},
            "loss_fn_inputs": {"target_tokens": {"data": [6], "dtype": "int64", "shape": [1]}, "weights": sparse},
        }
        bomb = {
            "model_id": model_id["model_id"],
            "seq_id": 1,
            "forward_backward_input": {"data": [datum] * 4, "loss_fn": "cross_entropy"},
        }
        before = _ingress_rss()
        sent = http.post("/api/v1/forward_backward", json=bomb)  # its seq_id gets a future, failed at once
        refused = future_result(http, sent.json()["request_id"])
        assert refused["category"] == "user" and refused["field"] == "data[0].loss_fn_inputs.weights", refused
        assert "limits.max_sparse_input_width" in refused["error"]
        assert _ingress_rss() - before < 32 * 2**20
    worker.forward_backward(data, "cross_entropy").result()
    worker.optim_step(types.AdamParams(learning_rate=1e-3)).result()
