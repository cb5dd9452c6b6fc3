"""Custom losses on the server: the real SDK's create_custom_loss uploads a traced loss, forward_backward_custom
runs it on the trainers in one round trip, and the result equals the SDK's client-side path for the same loss."""

from __future__ import annotations

import dataclasses

import httpx
import numpy as np
import pytest
import tinker
import torch
from tinker import types
from tinker.lib.public_interfaces.custom_loss import encode_graph

from tests.integration.helpers import logprobs_of, new_client, sft_datums


def clipped_weighted_nll(logprobs, weights, advantages):  # type: ignore[no-untyped-def]
    """A loss no built-in computes: advantage-scaled NLL, each token's term capped, plus metrics."""
    per_token = torch.clamp(-logprobs * weights * advantages, max=20.0)
    loss = per_token.sum()
    return loss, {"custom/nll:sum": loss, "custom/capped:mean": (per_token >= 20.0).float().mean()}


RANKS = {"logprobs": 1, "weights": 1, "advantages": 1}


def _data(tokenizer) -> list[types.Datum]:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    out = []
    for d in sft_datums(tokenizer, 3):
        n = len(d.loss_fn_inputs["target_tokens"].data)
        inputs = {**d.loss_fn_inputs, "advantages": types.TensorData.from_numpy(rng.uniform(0.5, 1.5, n))}
        out.append(types.Datum(model_input=d.model_input, loss_fn_inputs=inputs))
    return out


def _without_advantages(datum: types.Datum) -> dict[str, types.TensorData]:
    return {k: v for k, v in datum.loss_fn_inputs.items() if k != "advantages"}


@pytest.fixture(scope="module")
def handle(service_client: tinker.ServiceClient):  # type: ignore[no-untyped-def]
    return service_client.create_custom_loss(clipped_weighted_nll, RANKS).result()


def test_server_side_equals_the_client_side_path_and_learns(service_client, handle):  # type: ignore[no-untyped-def]
    assert handle.loss_id is not None  # uploaded: client/config says custom_loss_server_side
    server_client, local_client = new_client(service_client, seed=41), new_client(service_client, seed=41)
    data = _data(server_client.get_tokenizer())

    server = server_client.forward_backward_custom(data, handle).result()
    local = local_client.forward_backward_custom(data, dataclasses.replace(handle, loss_id=None)).result()
    assert "surrogate_loss:sum" in local.metrics and "surrogate_loss:sum" not in server.metrics  # two paths
    for key in ("loss:sum", "custom/nll:sum", "custom/capped:mean"):
        assert server.metrics[key] == pytest.approx(local.metrics[key], rel=1e-5, abs=1e-6), key
    assert server.metrics["custom/nll:sum"] == pytest.approx(server.metrics["loss:sum"], rel=1e-6)
    for a, b in zip(logprobs_of(server), logprobs_of(local), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)

    for client in (server_client, local_client):
        client.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    plain = [types.Datum(model_input=d.model_input, loss_fn_inputs=_without_advantages(d)) for d in data]
    after = [logprobs_of(c.forward(plain, "cross_entropy").result()) for c in (server_client, local_client)]
    for a, b, first in zip(*after, logprobs_of(server), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-4)  # the same step
        assert np.abs(a - first).max() > 1e-3  # and a real one

    losses = [server.metrics["loss:sum"]]
    for _ in range(3):
        result = server_client.forward_backward_custom(data, handle).result()
        server_client.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        losses.append(result.metrics["loss:sum"])
    assert losses[-1] < 0.8 * losses[0], losses


def test_inputs_the_loss_declared_must_come_with_the_data(service_client, handle):  # type: ignore[no-untyped-def]
    tc = new_client(service_client, seed=42)
    data = _data(tc.get_tokenizer())
    wrong = [  # advantages as [T, 1]: rank 2, declared 1 (sent straight, past the SDK's own check)
        types.Datum(
            model_input=d.model_input,
            loss_fn_inputs={
                **d.loss_fn_inputs,
                "advantages": types.TensorData.from_numpy(d.loss_fn_inputs["advantages"].to_numpy()[:, None]),
            },
        )
        for d in data
    ]
    with pytest.raises(tinker.RequestFailedError, match=r"loss_fn_inputs\.advantages has rank 2"):
        tc.forward_backward(wrong, "custom", {"loss_id": handle.loss_id}).result()
    with pytest.raises(tinker.RequestFailedError, match="no custom loss 'nope'"):
        tc.forward_backward(data, "custom", {"loss_id": "nope"}).result()


def test_a_graph_the_allow_list_refuses_is_a_user_error_naming_the_node(base_url, service_client, handle):  # type: ignore[no-untyped-def]
    """The SDK checks graphs too, so this request is tampered after encoding, as a hostile client could."""
    graph = encode_graph(handle).model_dump()
    i, node = next((i, n) for i, n in enumerate(graph["nodes"]) if n["target"] == "torch.clamp")
    node["target"] = "torch.load"
    body = {
        "session_id": service_client.holder.get_session_id(),
        "custom_loss_seq_id": 999,
        "name": "tampered",
        "inputs": [x.model_dump() for x in handle.inputs],
        "graph": graph,
    }
    response = httpx.post(
        f"{base_url}/api/v1/create_custom_loss", json=body, headers={"X-API-Key": "tml-integration-tests"}
    )
    assert response.status_code == 400, response.text
    assert f"graph.nodes[{i}]" in response.text and "torch.load" in response.text

    node["target"], node["args"], node["kwargs"] = "operator.pow", [7, 10**9], {}  # planned on every rank, for hours
    response = httpx.post(
        f"{base_url}/api/v1/create_custom_loss", json=body, headers={"X-API-Key": "tml-integration-tests"}
    )
    assert response.status_code == 400, response.text
    assert response.json()["field"] == f"graph.nodes[{i}]" and "only constant operands" in response.text
