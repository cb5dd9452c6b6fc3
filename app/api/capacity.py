"""The server's shape and load (GET server_status): each base model's trainers and samplers with their
configured capacity, replicas and the work in flight, for the web console (app/console) and operators."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter

from app.api.deps import ServicesDep
from app.api.quotas import sample_share

router = APIRouter(prefix="/api/v1")


@router.get("/server_status")
async def server_status(services: ServicesDep) -> dict:
    """Read-only and the same for every user. `in_flight`: operations (trainers) or samples (samplers) this
    ingress replica handed on and not yet answered; `replicas`: by Serve replica state, null when unknown."""
    cfg = services.config
    trainer_ready, sampler_ready, replicas = await asyncio.gather(
        services.trainers.ready(),
        services.samplers.ready(),
        services.replicas.replicas() if services.replicas is not None else asyncio.sleep(0, None),
    )
    known = replicas or None  # {} when Serve could not be read
    trainers_busy, samplers_busy = services.trainers.in_flight(), services.samplers.in_flight()
    models = []
    for base in cfg.base_models:
        sampler = base.sampler
        models.append(
            {
                "name": base.name,
                "max_context_length": services.model_limits[base.name].max_context_length,
                "trainers": [
                    {
                        "name": name,
                        "num_workers": group.num_workers,
                        "cpus_per_worker": group.cpus_per_worker,
                        "use_gpu": group.use_gpu,
                        "ready": trainer_ready.get(name, False),
                        "replicas": known.get(("trainer", name), {}) if known else None,
                        "in_flight": trainers_busy.get(name, 0),
                    }
                    for name, group in base.trainer_groups().items()
                ],
                "sampler": {
                    "min_replicas": sampler.min_replicas,
                    "max_replicas": sampler.max_replicas,
                    "max_ongoing_requests": sampler.max_ongoing_requests,
                    "num_gpus": sampler.num_gpus,
                    "ready": sampler_ready.get(base.name, False),
                    "replicas": known.get(("sampler", base.name), {}) if known else None,
                    "in_flight": samplers_busy.get(base.name, 0),
                    "max_pending": cfg.quotas.max_pending_samples,
                    "max_pending_per_user": sample_share(cfg.quotas),
                },
            }
        )
    return {"base_models": models, "ingress_replicas": cfg.ingress_replicas}
