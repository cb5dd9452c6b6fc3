"""Failure injection (runs last: it restarts the shared worker group, the ingress, then the whole app).

A training worker is killed: in-flight work fails promptly with a clear error instead of hanging, and
after Ray Train restarts the group, new models train again. The ingress replica is killed: work already
queued finishes and its futures are answered by the new replica. The Serve app is stopped and started again
on the same state: runs, checkpoints and finished futures survive, futures left waiting are failed, and
a model comes back from its checkpoint."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import ray
import tinker
from ray import serve

from tests.integration.conftest import BASE_MODEL, replace_app, server_config
from tests.integration.helpers import logprobs_of, new_client, sft_datums, train_steps

RESTART_BUDGET_S = 180.0  # Ray Train detects the death, restarts both ranks, reloads the base model


def test_killed_worker_fails_in_flight_work_and_the_group_recovers(service_client):
    trainer = serve.get_deployment_handle(f"Trainer:{BASE_MODEL}", app_name="tinker")
    victim = new_client(service_client, seed=41)
    data = sft_datums(victim.get_tokenizer())
    train_steps(victim, data, 1)
    pids = trainer.worker_pids.remote().result()
    assert len(pids) == 2 and all(isinstance(p, int) for p in pids)

    os.kill(pids[1], signal.SIGKILL)
    started = time.monotonic()
    with pytest.raises(tinker.RequestFailedError) as info:
        victim.forward(data, "cross_entropy").result()
    assert time.monotonic() - started < RESTART_BUDGET_S
    assert "restart" in info.value.message or "not loaded" in info.value.message

    new_pids = trainer.worker_pids.remote().result()
    assert pids[1] not in new_pids
    survivor = new_client(service_client, seed=42)
    first = survivor.forward_backward(data, "cross_entropy").result().metrics["loss:sum"]
    survivor.optim_step(tinker.types.AdamParams(learning_rate=1e-2)).result()
    assert survivor.forward(data, "cross_entropy").result().metrics["loss:sum"] < first


def _retrieve(http: httpx.Client, request_id: str) -> dict:
    return http.post("/api/v1/retrieve_future", json={"request_id": request_id}).json()


def test_ingress_restart_loses_nothing(service_client, base_url: str):
    """Only the HTTP front dies: work queued on the trainer finishes and every future is still answered."""
    tc = new_client(service_client, seed=45)
    data = sft_datums(tc.get_tokenizer())
    before = tc.forward_backward(data, "cross_entropy").result().metrics["loss:sum"]
    in_flight = [tc.optim_step(tinker.types.AdamParams(learning_rate=1e-2)), tc.forward(data, "cross_entropy")]
    (replica,) = [a for a in ray.util.list_named_actors(all_namespaces=True) if "#Ingress#" in a["name"]]
    ray.kill(ray.get_actor(replica["name"], namespace=replica["namespace"]), no_restart=True)
    started = time.monotonic()
    after = in_flight[1].result().metrics["loss:sum"]  # the SDK retries until the new ingress answers
    assert after < before and in_flight[0].result() is not None
    assert time.monotonic() - started < 120
    (new,) = [a for a in ray.util.list_named_actors(all_namespaces=True) if "#Ingress#" in a["name"]]
    assert new["name"] != replica["name"]
    assert service_client.create_rest_client().get_training_run(tc.model_id).result().training_run_id == tc.model_id


def test_app_restart_keeps_what_was_saved(service_client, base_url: str, state_dir: Path):
    tc = new_client(service_client, seed=43)
    data = sft_datums(tc.get_tokenizer())
    train_steps(tc, data, 1)
    saved = tc.save_state("before-restart").result().path
    expected = logprobs_of(tc.forward(data, "cross_entropy").result())
    with httpx.Client(base_url=base_url, timeout=60, headers={"X-API-Key": "tml-integration-tests"}) as http:
        # A finished future, and one left waiting: seq_id 99 of a model whose next seq_id is far lower.
        finished = http.post("/api/v1/unload_model", json={"model_id": new_client(service_client, seed=44).model_id})
        finished_result = _retrieve(http, finished.json()["request_id"])
        waiting = http.post(
            "/api/v1/optim_step", json={"model_id": tc.model_id, "seq_id": 99, "adam_params": {"learning_rate": 1e-3}}
        ).json()
        assert _retrieve(http, waiting["request_id"])["type"] == "try_again"

        replace_app(server_config(state_dir), base_url)

        assert _retrieve(http, finished.json()["request_id"]) == finished_result
        failed = _retrieve(http, waiting["request_id"])
        assert failed.get("category") == "server" and failed["error"], failed  # failed, not left pending
    rest = service_client.create_rest_client()
    assert rest.get_training_run(tc.model_id).result().base_model == BASE_MODEL
    checkpoints = rest.list_checkpoints(tc.model_id).result().checkpoints
    assert "weights/before-restart" in {c.checkpoint_id for c in checkpoints}
    with pytest.raises(tinker.RequestFailedError, match="not loaded"):  # its in-memory state went with the app
        tc.forward(data, "cross_entropy").result()
    restored = service_client.create_training_client_from_state_with_optimizer(saved).result()
    for got, want in zip(logprobs_of(restored.forward(data, "cross_entropy").result()), expected, strict=True):
        np.testing.assert_array_equal(got, want)
