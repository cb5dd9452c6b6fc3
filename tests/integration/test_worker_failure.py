"""Failure injection (runs last: it restarts the shared worker group, then the whole app).

A training worker is killed: in-flight work fails promptly with a clear error instead of hanging, and
after Ray Train restarts the group, new models train again. The Serve app is stopped and started again
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
import tinker
from ray import serve

from deployments.builder import build_app
from tests.integration.conftest import BASE_MODEL, server_config
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
        waiting = http.post("/api/v1/optim_step", json={"model_id": tc.model_id, "seq_id": 99,
                                                        "adam_params": {"learning_rate": 1e-3}}).json()
        assert _retrieve(http, waiting["request_id"])["type"] == "try_again"

        serve.delete("tinker", _blocking=False)  # the trainers' graceful shutdown waits up to 60 s for the
        deadline = time.monotonic() + 240         # submit left waiting, so this takes longer than serve's own wait
        while "tinker" in serve.status().applications:
            assert time.monotonic() < deadline, "the app was never deleted"
            time.sleep(2)
        serve.run(build_app(server_config(state_dir)), name="tinker", route_prefix="/")
        deadline = time.monotonic() + 300
        while http.get("/ready").status_code != 200:
            assert time.monotonic() < deadline, "the app never became ready again"
            time.sleep(1)

        assert _retrieve(http, finished.json()["request_id"]) == finished_result
        failed = _retrieve(http, waiting["request_id"])
        assert failed.get("category") == "server" and failed["error"], failed  # failed, not left pending
    rest = service_client.create_rest_client()
    assert rest.get_training_run(tc.model_id).result().base_model == BASE_MODEL
    assert "weights/before-restart" in {c.checkpoint_id for c in rest.list_checkpoints(tc.model_id).result().checkpoints}
    with pytest.raises(tinker.RequestFailedError, match="not loaded"):  # its in-memory state went with the app
        tc.forward(data, "cross_entropy").result()
    restored = service_client.create_training_client_from_state_with_optimizer(saved).result()
    for got, want in zip(logprobs_of(restored.forward(data, "cross_entropy").result()), expected, strict=True):
        np.testing.assert_array_equal(got, want)
