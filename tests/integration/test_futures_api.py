"""retrieve_futures (the SDK's session poller), cancel_future and join_sampling_session: through the real SDK,
and raw HTTP where the SDK hides what is checked (cursors, request ids)."""

from __future__ import annotations

import asyncio
import time

import httpx
import numpy as np
import pytest
import tinker
from tinker import types
from tinker.proto.response_conv import deserialize_proto_response

from tests.integration.conftest import BASE_MODEL
from tests.integration.helpers import new_client

PROTO = "application/x-protobuf"
PROBE = list(range(20, 36))  # tokens of the datum whose logprobs show the weights


@pytest.fixture(scope="module")
def http(base_url):
    with httpx.Client(base_url=base_url, timeout=60, headers={"X-API-Key": "tml-integration-tests"}) as client:
        yield client


def _sample_body(session_id: str, seq_id: int, max_tokens: int = 8) -> dict:
    return {
        "sampling_session_id": session_id,
        "seq_id": seq_id,
        "num_samples": 1,
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": PROBE}]},
        "sampling_params": {"max_tokens": max_tokens, "temperature": 0.0, "seed": 0, "stop": []},
    }


def _poll_all(http: httpx.Client, session_id: str, clone: int, want: set[str], cursor: int = 0) -> tuple[list, int]:
    """Long-poll retrieve_futures until every request in `want` is reported; (completions, cursor)."""
    seen: list[dict] = []
    deadline = time.monotonic() + 120
    while not want <= {c["request_id"] for c in seen}:
        assert time.monotonic() < deadline, f"never reported: {want - {c['request_id'] for c in seen}}"
        target = {"type": "sampling_session", "sampling_session_id": session_id, "cloned_sampler_id": clone}
        response = http.post("/api/v1/retrieve_futures", json={"target": target, "prev_cursor": cursor})
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["cursor"] >= cursor
        seen += body["completions"]
        cursor = body["cursor"]
    return seen, cursor


def _datum_json(tokens: list[int], weight: float = 1.0) -> dict:
    n = len(tokens) - 1
    return {
        "model_input": {"chunks": [{"type": "encoded_text", "tokens": tokens[:-1]}]},
        "loss_fn_inputs": {
            "target_tokens": {"data": tokens[1:], "dtype": "int64", "shape": [n]},
            "weights": {"data": [weight] * n, "dtype": "float32", "shape": [n]},
        },
    }


def test_client_config_turns_the_features_on(http, service_client):
    config = http.post("/api/v1/client/config", json={"sdk_version": tinker.__version__}).json()
    assert config["sample_use_retrieve_futures"] is True and config["sample_join_sampling_session"] is True
    assert http.post("/api/v1/client/dynamic_config", json={"sdk_version": "0"}).json()["sample_cancel_enabled"]


def test_sdk_samples_through_the_session_poller(service_client):
    sampler = service_client.create_sampling_client(base_model=BASE_MODEL)
    sampler = sampler.result()
    params = types.SamplingParams(max_tokens=6, temperature=0.0, seed=1)

    async def many() -> list[types.SampleResponse]:
        prompt = types.ModelInput.from_ints(PROBE)
        return await asyncio.gather(*(sampler.sample(prompt, 2, params) for _ in range(6)))

    results = asyncio.run(many())
    poller = sampler._futures_poller  # the SDK waited through retrieve_futures, not per-sample polls
    assert poller is not None and poller._cursor >= 6
    first = results[0].sequences[0]
    assert len(first.tokens) == len(first.logprobs) == 6 and first.stop_reason == "length"
    for result in results:  # greedy: every sequence the same, with the same logprobs
        for seq in result.sequences:
            assert seq.tokens == first.tokens
            np.testing.assert_allclose(seq.logprobs, first.logprobs, atol=1e-5)
    assert len({seq.sequence_id for result in results for seq in result.sequences}) == 12


def test_retrieve_futures_cursor_clones_payloads_and_cancel(http, service_client):
    session = service_client.create_sampling_client(base_model=BASE_MODEL).result()._sampling_session_id
    ids = [http.post("/api/v1/asample", json=_sample_body(session, seq)).json()["request_id"] for seq in (1, 2)]
    clone_id = http.post("/api/v1/asample", json=_sample_body(session, 3_000_000_001)).json()["request_id"]

    seen, cursor = _poll_all(http, session, 0, set(ids))
    assert sorted(c["request_id"] for c in seen) == sorted(ids)  # each once; not the other clone's
    assert all(c["state"] == "finished" and c["response_payload_uncompressed_size"] > 0 for c in seen)
    assert _poll_all(http, session, 3, {clone_id})[0][0]["request_id"] == clone_id

    # payloads still come from retrieve_future: protobuf of the reported size, or JSON for older SDKs
    proto = http.post("/api/v1/retrieve_future", json={"request_id": ids[0]}, headers={"Accept": PROTO})
    sizes = {c["request_id"]: c["response_payload_uncompressed_size"] for c in seen}
    assert PROTO in proto.headers["content-type"] and len(proto.content) == sizes[ids[0]]
    as_json = http.post("/api/v1/retrieve_future", json={"request_id": ids[0]}).json()
    parsed = deserialize_proto_response(proto.content, types.SampleResponse)
    assert as_json["sequences"][0]["tokens"] == parsed.sequences[0].tokens

    # nothing new: an immediate answer (timeout 0) with the same cursor
    target = {"sampling_session_id": session, "cloned_sampler_id": 0}
    started = time.monotonic()
    empty = http.post("/api/v1/retrieve_futures", json={"target": target, "prev_cursor": cursor, "timeout": 0})
    assert empty.json() == {"completions": [], "cursor": cursor} and time.monotonic() - started < 5

    # a cancelled sample is reported failed, and retrieve_future says it was cancelled
    doomed = http.post("/api/v1/asample", json=_sample_body(session, 4, max_tokens=1000)).json()["request_id"]
    assert http.post("/api/v1/cancel_future", json={"request_id": doomed}).status_code == 200
    failed, _ = _poll_all(http, session, 0, {doomed}, cursor)
    assert failed == [{"state": "failed", "request_id": doomed}]
    error = http.post("/api/v1/retrieve_future", json={"request_id": doomed}).json()
    assert error["cancelled"] is True and error["category"] == "user"
    assert http.post("/api/v1/cancel_future", json={"request_id": ids[0]}).status_code == 200  # finished: no-op
    kept = http.post("/api/v1/retrieve_future", json={"request_id": ids[0]}, headers={"Accept": PROTO})
    assert kept.content == proto.content


def test_unknown_ids_are_not_found(http):
    missing = http.post("/api/v1/cancel_future", json={"request_id": "no-such-request"})
    assert missing.status_code == 404 and missing.json()["field"] == "request_id"
    target = {"sampling_session_id": "no-such-session", "cloned_sampler_id": 0}
    assert http.post("/api/v1/retrieve_futures", json={"target": target}).status_code == 404
    assert http.post("/api/v1/join_sampling_session", json={"sampling_session_id": "nope"}).status_code == 404


def _train_raw(http: httpx.Client, model_id: str, slow: list[dict], cancelled: list[dict] | None) -> dict:
    """seq 1: a slow forward_backward; seq 2 (when given): one cancelled at once, while seq 1 runs; then
    optim_step and a forward of PROBE. Returns the results of every seq_id by number."""
    ops: list[tuple[str, dict]] = [("forward_backward", {"loss_fn": "cross_entropy", "data": slow})]
    if cancelled is not None:
        ops.append(("forward_backward", {"loss_fn": "cross_entropy", "data": cancelled}))
    ids = {}
    for seq, (route, fb_input) in enumerate(ops, start=1):
        body = {"model_id": model_id, "seq_id": seq, "forward_only": False, "forward_backward_input": fb_input}
        ids[seq] = http.post(f"/api/v1/{route}", json=body).json()["request_id"]
    if cancelled is not None:
        assert http.post("/api/v1/cancel_future", json={"request_id": ids[2]}).status_code == 200
    seq = len(ops) + 1
    step = {"model_id": model_id, "seq_id": seq, "adam_params": {"learning_rate": 1e-2}}
    ids[seq] = http.post("/api/v1/optim_step", json=step).json()["request_id"]
    probe = {"loss_fn": "cross_entropy", "data": [_datum_json(PROBE)]}
    forward = {"model_id": model_id, "seq_id": seq + 1, "forward_only": True, "forward_backward_input": probe}
    ids[seq + 1] = http.post("/api/v1/forward_backward", json=forward).json()["request_id"]
    results = {}
    for seq, request_id in ids.items():
        for _ in range(30):
            result = http.post("/api/v1/retrieve_future", json={"request_id": request_id}).json()
            if result.get("type") != "try_again":
                break
        results[seq] = result
    return results


def test_cancelled_queued_forward_backward_never_runs(http, service_client):
    rng = np.random.default_rng(0)
    slow = [_datum_json(rng.integers(5, 200, size=61).tolist()) for _ in range(1024)]
    cancelled_model = new_client(service_client, seed=41)
    reference_model = new_client(service_client, seed=41)  # the same initial weights
    started = time.monotonic()
    results = _train_raw(http, cancelled_model.model_id, slow, [_datum_json(PROBE, weight=50.0)])
    print(f"cancel run took {time.monotonic() - started:.1f} s")
    assert results[2]["cancelled"] is True and results[2]["category"] == "user"
    assert "loss:sum" in results[1]["metrics"] and "error" not in results[3]  # the neighbours ran
    reference = _train_raw(http, reference_model.model_id, slow, None)
    got = results[4]["loss_fn_outputs"][0]["logprobs"]["data"]
    want = reference[3]["loss_fn_outputs"][0]["logprobs"]["data"]
    np.testing.assert_allclose(got, want, atol=1e-6)  # the cancelled gradient never reached the weights


def test_clones_join_the_sampling_session(service_client):
    original = service_client.create_sampling_client(base_model=BASE_MODEL).result()
    handle = original.get_sampler_handle()
    clones = [
        tinker.SamplingClient.from_sampler_handle(handle, api_key="tml-integration-tests") for _ in range(2)
    ]  # each a second client of the same sampling session, with its own connection and poller
    prompt, params = types.ModelInput.from_ints(PROBE), types.SamplingParams(max_tokens=5, temperature=0.0, seed=2)
    expected = original.sample(prompt, 1, params).result().sequences[0].tokens
    for clone in clones:
        assert clone.sample(prompt, 1, params).result().sequences[0].tokens == expected
    assert sorted(clone._cloned_sampler_id for clone in clones) == [1, 2]  # allocated by the server, in order
    assert original._cloned_sampler_id == 0
