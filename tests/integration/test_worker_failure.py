"""Failure injection (runs last: it restarts the shared worker group). A training worker is killed:
in-flight work fails promptly with a clear error instead of hanging, and after Ray Train restarts the
group, new models train again."""

from __future__ import annotations

import os
import signal
import time

import pytest
import tinker
from ray import serve

from tests.integration.conftest import BASE_MODEL
from tests.integration.helpers import new_client, sft_datums, train_steps

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
