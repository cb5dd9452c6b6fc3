"""What the worker group relies on in Ray Train: the environment variable of its start timeout, which Ray Train
hands from the process that calls fit() to its controller, where the worker group reads it."""

from __future__ import annotations

import pytest
from ray.train.v2._internal.constants import (
    ENV_VARS_TO_PROPAGATE,
    WORKER_GROUP_START_TIMEOUT_S_ENV_VAR,
    get_env_vars_to_propagate,
)

from app.trainer.worker_group import WORKER_GROUP_START_TIMEOUT_ENV


def test_ray_train_hands_the_start_timeout_to_its_controller(monkeypatch: pytest.MonkeyPatch) -> None:
    assert WORKER_GROUP_START_TIMEOUT_ENV == WORKER_GROUP_START_TIMEOUT_S_ENV_VAR
    assert WORKER_GROUP_START_TIMEOUT_ENV in ENV_VARS_TO_PROPAGATE
    monkeypatch.setenv(WORKER_GROUP_START_TIMEOUT_ENV, "600.0")
    assert get_env_vars_to_propagate()[WORKER_GROUP_START_TIMEOUT_ENV] == "600.0"
