"""Wire variants the current SDK does not use by default: zstd-compressed protobuf, and JSON bodies and
results for older SDKs. Raw HTTP against the running app; the results must match the SDK's own path."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import zstandard
from tinker import types
from tinker.proto.request_conv import forward_backward_request_to_proto
from tinker.proto.response_conv import deserialize_forward_backward_output

from tests.integration.helpers import new_client

TOKENS, TARGETS = [5, 6, 7, 8], [6, 7, 8, 9]


def _poll(http: httpx.Client, request_id: str, accept: str) -> httpx.Response:
    for _ in range(20):
        response = http.post("/api/v1/retrieve_future", json={"request_id": request_id}, headers={"Accept": accept})
        if "try_again" not in response.text[:100]:
            return response
    raise AssertionError("future never finished")


@pytest.fixture
def setup(base_url, service_client):
    tc = new_client(service_client, seed=31)  # a fresh model per test: the SDK used seq_id 1, raw requests use 2
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(TOKENS), loss_fn_inputs={"target_tokens": TARGETS, "weights": [1.0] * 4}
    )
    expected = tc.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
    with httpx.Client(base_url=base_url, timeout=60, headers={"X-API-Key": "tml-integration-tests"}) as http:
        yield tc, http, expected


def test_zstd_protobuf_request(setup):
    tc, http, expected = setup
    request = types.ForwardBackwardRequest(
        model_id=tc.model_id,
        seq_id=2,
        forward_backward_input=types.ForwardBackwardInput(
            data=[
                types.Datum(
                    model_input=types.ModelInput.from_ints(TOKENS),
                    loss_fn_inputs={"target_tokens": TARGETS, "weights": [1.0] * 4},
                )
            ],
            loss_fn="cross_entropy",
        ),
    )
    message = forward_backward_request_to_proto(request)
    message.forward_only = True  # as the SDK's forward() does after the conversion
    body = zstandard.ZstdCompressor().compress(message.SerializeToString())
    submitted = http.post(
        "/api/v1/forward_backward",
        content=body,
        headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "zstd"},
    )
    assert submitted.status_code == 200, submitted.text
    result = _poll(http, submitted.json()["request_id"], "application/x-protobuf")
    assert "application/x-protobuf" in result.headers["content-type"]
    output = deserialize_forward_backward_output(result.content)
    np.testing.assert_allclose(output.loss_fn_outputs[0]["logprobs"].to_numpy(), expected, atol=1e-6)


def test_json_request_and_json_result(setup):
    tc, http, expected = setup
    body = {
        "model_id": tc.model_id,
        "seq_id": 2,
        "forward_only": True,
        "forward_backward_input": {
            "loss_fn": "cross_entropy",
            "data": [
                {
                    "model_input": {"chunks": [{"type": "encoded_text", "tokens": TOKENS}]},
                    "loss_fn_inputs": {
                        "target_tokens": {"data": TARGETS, "dtype": "int64", "shape": [4]},
                        "weights": {"data": [1.0] * 4, "dtype": "float32", "shape": [4]},
                    },
                }
            ],
        },
    }
    submitted = http.post("/api/v1/forward_backward", json=body)
    assert submitted.status_code == 200, submitted.text
    result = _poll(http, submitted.json()["request_id"], "application/json").json()
    logprobs = result["loss_fn_outputs"][0]["logprobs"]
    assert logprobs["shape"] == [4] and logprobs["dtype"] == "float32"
    np.testing.assert_allclose(logprobs["data"], expected, atol=1e-6)
    assert result["metrics"]["loss:sum"] == pytest.approx(-float(np.sum(expected)), rel=1e-5)
