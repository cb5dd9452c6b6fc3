"""Every deployment of the built app is health-checked every 2 s (a dead replica is replaced within about that long,
not after Serve's 10 s) and drains in rounds of 0.5 s (not Serve's 2 s): deployments.builder.REPLICA_CHECKS."""

from __future__ import annotations

import pytest
from ray.serve import Application

import deployments.builder
from app.config import ServerConfig


def _limits(config: ServerConfig) -> dict[str, dict[str, int | str]]:
    return {base.name: {"vocab_size": 2048, "max_context_length": 512, "arch": "llama"} for base in config.base_models}


def test_every_deployment_notices_a_dead_replica_within_2_s_and_drains_in_half_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(deployments.builder, "route_app_logs", lambda: None)
    monkeypatch.setattr(deployments.builder, "_model_limits", _limits)  # no model is read
    tiny = {"name": "tiny", "path": "models/tiny", "embedded_preset": "tiny", "critic_trainer": {"num_workers": 1}}
    ingress = deployments.builder.build_app({"auth": {"mode": "any_tml_key_on_loopback"}, "base_models": [tiny]})
    trainers, samplers = ingress._bound_deployment.init_args[1:3]
    apps: list[Application] = [ingress, *trainers.values(), *samplers.values()]
    assert len(apps) == 4  # the ingress, the policy and critic trainers, the sampler
    for app in apps:
        config = app._bound_deployment._deployment_config
        assert (config.health_check_period_s, config.graceful_shutdown_wait_loop_s) == (2.0, 0.5), app
