"""Every deployment of the app is health-checked every 2 s (a dead replica is replaced within about that long, not
Serve's 10 s) and drains in rounds of 0.5 s (not Serve's 2 s), by its own deployment options."""

from __future__ import annotations

from typing import Any

from app.config import ServerConfig
from deployments.ingress import Ingress
from deployments.sampler import Sampler
from deployments.trainer import Trainer

TINY = {"name": "tiny", "path": "models/tiny", "embedded_preset": "tiny"}


def test_every_deployment_notices_a_dead_replica_within_2_s_and_drains_in_half_seconds() -> None:
    config = ServerConfig(base_models=[TINY], auth={"mode": "any_tml_key_on_loopback"})
    options: dict[str, dict[str, Any]] = {
        "Ingress": Ingress.deployment_options(config),
        "Sampler": Sampler.deployment_options(config, "tiny"),
        **{
            f"Trainer {name}": Trainer.deployment_options(config, name)
            for name in config.base_models[0].trainer_groups()
        },
    }
    for name, chosen in options.items():
        assert chosen.get("health_check_period_s") == 2.0, (name, chosen)
        assert chosen.get("graceful_shutdown_wait_loop_s") == 0.5, (name, chosen)
