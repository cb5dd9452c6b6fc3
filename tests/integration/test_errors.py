"""Bad input gets a prompt user error naming the problem, and the client keeps working afterwards."""

from __future__ import annotations

import time

import httpx
import pytest
import tinker
from tinker import types
from tinker.proto.request_conv import forward_backward_request_to_proto

from tests.integration.conftest import BASE_MODEL, MAX_TOKENS
from tests.integration.helpers import new_client, sft_datums

PROMPT_S = 10.0  # an error must surface well before any retry loop would give up


@pytest.fixture(scope="module")
def client(service_client):
    return new_client(service_client, seed=21)


def _user_error(future) -> tinker.RequestFailedError:
    started = time.monotonic()
    with pytest.raises(tinker.RequestFailedError) as info:
        future.result()
    assert time.monotonic() - started < PROMPT_S
    assert info.value.category == types.RequestErrorCategory.User
    return info.value


def _datum(inputs: list[int], targets: list[int], weights: list[float] | None = None) -> types.Datum:
    weights = [1.0] * len(targets) if weights is None else weights
    return types.Datum(
        model_input=types.ModelInput.from_ints(inputs), loss_fn_inputs={"target_tokens": targets, "weights": weights}
    )


def test_unknown_loss(client):
    err = _user_error(client.forward_backward(sft_datums(client.get_tokenizer(), 1), "no_such_loss"))
    assert "no_such_loss" in err.message and "loss_fn" in err.message


def test_target_length_mismatch(client):
    err = _user_error(client.forward_backward([_datum([1, 2, 3], [2, 3])], "cross_entropy"))
    assert "data[0].loss_fn_inputs." in err.message and "model_input has 3 tokens" in err.message


def test_token_outside_vocabulary(client):
    err = _user_error(client.forward_backward([_datum([5, 6, 7], [6, 7, 99_999])], "cross_entropy"))
    assert "data[0].loss_fn_inputs.target_tokens" in err.message and "99999" in err.message


def test_datum_too_long(client):
    n = MAX_TOKENS + 1
    err = _user_error(client.forward_backward([_datum([5] * n, [6] * n)], "cross_entropy"))
    assert "data[0].model_input" in err.message and str(MAX_TOKENS) in err.message


def test_missing_loss_input(client):
    datum = types.Datum(model_input=types.ModelInput.from_ints([5, 6]), loss_fn_inputs={"weights": [1.0, 1.0]})
    err = _user_error(client.forward_backward([datum], "cross_entropy"))
    assert "target_tokens" in err.message


def test_bad_adam_params(client):
    err = _user_error(client.optim_step(types.AdamParams(learning_rate=-1.0)))
    assert "adam_params.learning_rate" in err.message


def test_client_keeps_working_after_errors(client):
    data = sft_datums(client.get_tokenizer(), 2)
    client.forward_backward(data, "no_such_loss")  # leaves a failed seq_id behind, never awaited
    first = client.forward_backward(data, "cross_entropy").result().metrics["loss:sum"]
    client.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    assert client.forward(data, "cross_entropy").result().metrics["loss:sum"] < first


def test_unknown_base_model_and_rank_limit(service_client):
    for kwargs, field in (
        ({"base_model": "unknown/model"}, "base_model"),
        ({"base_model": BASE_MODEL, "rank": 4096}, "lora_config.rank"),
    ):
        started = time.monotonic()
        with pytest.raises(tinker.BadRequestError) as info:
            service_client.create_lora_training_client(**kwargs).result()
        assert time.monotonic() - started < PROMPT_S
        assert info.value.body["field"] == field


def _fb_body(model_id: str, seq_id: int, datum: types.Datum) -> bytes:
    request = types.ForwardBackwardRequest(
        model_id=model_id,
        seq_id=seq_id,
        forward_backward_input=types.ForwardBackwardInput(data=[datum], loss_fn="cross_entropy"),
    )
    return forward_backward_request_to_proto(request).SerializeToString()


def test_http_level_errors_and_idempotent_resubmit(base_url, service_client):
    headers = {"X-API-Key": "tml-integration-tests", "Content-Type": "application/x-protobuf"}
    with httpx.Client(base_url=base_url, timeout=30) as http:
        assert http.post("/api/v1/create_session", json={}, headers={"X-API-Key": "nope"}).status_code == 401
        bad = http.post("/api/v1/forward_backward", content=b"\xff\x00garbage", headers=headers)
        assert bad.status_code == 400 and bad.json()["category"] == "user" and bad.json()["field"] == "body"
        gone = http.post("/api/v1/retrieve_future", json={"request_id": "nope"}, headers={"X-API-Key": "tml-raw"})
        assert gone.status_code == 404
        # A retried (model_id, seq_id) — new idempotency key, same seq — returns the original future.
        tc = new_client(service_client, seed=4)
        body = _fb_body(tc.model_id, 1, _datum([5, 6, 7], [6, 7, 8]))
        first = http.post("/api/v1/forward_backward", content=body, headers=headers).json()
        again = http.post("/api/v1/forward_backward", content=body, headers=headers).json()
        assert first["request_id"] == again["request_id"]
