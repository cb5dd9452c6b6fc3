"""Builds the bound Serve application from config: `serve run serve_config.yaml` imports `build_app`."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ray import serve
from ray.serve import Application

from app.config import BaseModelConfig, ServerConfig
from app.images.tokens import VisionSpec
from app.models import hub_cache
from app.models.embedded import build_embedded_model
from app.models.families import family_of, sampler_refusal
from app.models.model_config import ModelShape, model_shape
from app.models.precision import DTYPE_BYTES
from app.models.vision_base import image_token_id
from app.sampling import kv_budget
from app.trainer import model_defaults
from deployments import serve_env
from deployments.ingress import Ingress
from deployments.logs import route_app_logs
from deployments.sampler import Sampler
from deployments.trainer import Trainer

logger = logging.getLogger("tinker_serve.builder")

# Every deployment's: Serve notices a replica that died (killed, its process lost) only at its next health check of
# it, and starts a replacement then. At Serve's default period, 10 s, a dead Sampler's samples, a dead Trainer's steps
# or a dead Ingress's clients waited up to 11 s before a replacement even began to start; each deployment's check
# reads state in memory (the worker group's, vLLM engine's), so one every 2 s costs nothing measurable. A stopping
# replica (a redeploy, a replacement) waits for its ongoing requests in rounds, at least one even when idle: 0.5 s
# each, not Serve's 2 s.
REPLICA_CHECKS = {"health_check_period_s": 2.0, "graceful_shutdown_wait_loop_s": 0.5}


def _model_limits(config: ServerConfig) -> dict[str, dict[str, Any]]:
    """Vocabulary size, context length and family of each base model, read from its config (building embedded ones).
    A base of a family this server cannot train, or its sampler cannot serve, is refused here: nothing is trained on
    a model whose adapters cannot be sampled."""
    limits: dict[str, dict[str, Any]] = {}
    for i, base in enumerate(config.base_models):
        started = time.monotonic()
        local = Path(base.path).is_dir()
        if local:  # clients name its tokenizer by the served name: the server's paths are not theirs to see
            _register_name(base.name, Path(base.path))
        shape = model_shape(base.path)
        family = family_of(shape.model_type)
        refusal = sampler_refusal(family, on_gpu=base.sampler.num_gpus > 0)
        if refusal is not None:
            raise ValueError(f"base_models[{i}] ({base.name}): {refusal}")
        logger.info("base model %s at %s: config read in %.1f s", base.name, base.path, time.monotonic() - started)
        limits[base.name] = {
            "vocab_size": shape.vocab_size,
            "max_context_length": _context_length(base, shape),
            "arch": family.name,
            "tokenizer_id": base.name if local else base.path,  # a Hub id is public
            "vision": _vision(Path(base.path)) if local else None,
            "image_token_id": image_token_id(Path(base.path)) if local else None,
        }
    return limits


def _vision(model_dir: Path) -> dict[str, int] | None:
    """A local vision-language base's image processor (app.images.tokens.VisionSpec) as the ingress takes it."""
    spec = VisionSpec.of_model(model_dir)
    return None if spec is None else asdict(spec)


def _build_embedded_models(config: ServerConfig) -> None:
    """Build each embedded preset into its path, unless it is there already (BaseModelConfig.builds_embedded)."""
    for base in config.base_models:
        if base.builds_embedded():
            started = time.monotonic()
            build_embedded_model(str(base.embedded_preset), Path(base.path))
            logger.info("base model %s: embedded model built or found in %.1f s", base.name, time.monotonic() - started)
        elif base.embedded_preset:
            logger.warning(
                "base model %s: serving %s; embedded_preset %s is ignored (it builds only into a folder named %s): "
                "delete the line",
                base.name,
                base.path,
                base.embedded_preset,
                base.embedded_preset,
            )


def _with_model_defaults(config: ServerConfig) -> ServerConfig:
    """The config with each worker group's auto settings chosen for its base (app.trainer.model_defaults), and a CPU
    sampler's auto KV cache (app.sampling.kv_budget), logged."""
    bases = []
    for base in config.base_models:
        updates: dict[str, Any] = {}
        for field in ("trainer", "critic_trainer"):
            group = getattr(base, field)
            if group is not None:
                updates[field], reasons = model_defaults.for_model(group, base.path)
                if reasons:
                    logger.info("base model %s, %s: %s", base.name, field, "; ".join(reasons))
        if base.sampler.kv_cache_mib == "auto" and not base.sampler.num_gpus:  # on GPUs: gpu_memory_utilization
            shape = model_shape(base.path)
            memory = kv_budget.machine_memory_bytes()
            mib, reason = kv_budget.auto_kv_cache_mib(shape, _model_context(base, shape), _kv_dtype_bytes(base), memory)
            updates["sampler"] = base.sampler.model_copy(update={"kv_cache_mib": mib})
            logger.info("base model %s, sampler: %s", base.name, reason)
        bases.append(base.model_copy(update=updates))
    return config.model_copy(update={"base_models": bases})


def _model_context(base: BaseModelConfig, shape: ModelShape) -> int:
    """The model's context (its positions, or what its RoPE scaling gives), capped by the configured one if set."""
    return min(base.max_context_length or shape.context_length, shape.context_length)


def _kv_dtype_bytes(base: BaseModelConfig) -> int:
    """The bytes of one key or value in the Sampler's KV cache (its dtype's)."""
    return DTYPE_BYTES.get(base.sampler_dtype(), 4)


def _context_length(base: BaseModelConfig, shape: ModelShape) -> int:
    """max_context_length: the model's context (its positions, or what its RoPE scaling gives), capped by the
    configured one if set and, on CPU samplers, by what one KV cache holds (vLLM refuses to start a context it cannot
    hold once)."""
    context = _model_context(base, shape)
    if base.sampler.num_gpus > 0:
        return context
    held = shape.kv_cache_tokens(base.sampler.kv_cache_bytes(), _kv_dtype_bytes(base))
    if held is not None and held < context:
        logger.warning(
            "base model %s: its context is %d tokens, not %d: sampler.kv_cache_mib %d holds %d tokens of it; "
            "raise kv_cache_mib for longer contexts (training and sampling share max_context_length)",
            base.name,
            held,
            context,
            base.sampler.kv_cache_mib,
            held,
        )
        return held
    return context


def served_base_models(config: ServerConfig) -> tuple[ServerConfig, dict[str, dict[str, Any]]]:
    """The config with every base model's auto settings chosen (embedded models built first), and each base's
    limits as the app serves it (`_model_limits`); refuses a base that cannot be served."""
    _build_embedded_models(config)
    config = _with_model_defaults(config)
    return config, _model_limits(config)


def _register_name(name: str, path: Path) -> None:
    """Make a local base's served name resolve offline on this machine (tokenizers by model name; other machines
    resolve it through the /hub routes)."""
    try:
        snapshot = hub_cache.register(name, path)
    except (OSError, ValueError) as exc:
        logger.warning(
            "could not register %s in the Hugging Face cache (%s): naming it will not find its "
            "tokenizer offline; load it from %s instead",
            name,
            exc,
            path,
        )
    else:
        logger.info("base model %s: tokenizer and config resolvable by name (Hugging Face cache: %s)", name, snapshot)


def build_app(args: dict[str, Any]) -> Application:
    """Validate the whole config first (every error at once), then bind each base model's Trainers (one, or a
    second for critics) and its Sampler. The API keys are loaded once here too, so that api_keys mode without any
    fails before a replica starts; only the ingress replicas read them again (validation reads no file). Where Serve
    runs without the project's request-path settings (deployments/serve_env.py: a bare `serve run`), the app serves
    through Serve's proxy and says so in one warning."""
    route_app_logs()
    wrong = serve_env.missing()
    if wrong:
        logger.warning(wrong)
    config = ServerConfig.model_validate(args).resolved()
    pinned_port = serve_env.direct_port()
    if config.ingress_replicas > 1 and pinned_port is not None:
        raise ValueError(
            f"ingress_replicas: {config.ingress_replicas}, but Serve's direct ingress is pinned to one port "
            f"({pinned_port}), which admits one Ingress replica per node: set ingress_replicas to 1, or "
            "start Ray with HAProxy ingress (`python -m deployments.serve_env --cluster`)"
        )
    config.auth.load_keys()
    config, limits = served_base_models(config)
    raw = config.model_dump()
    trainers = {
        trainer: serve.deployment()(Trainer)
        .options(**{**Trainer.deployment_options(config, trainer), **REPLICA_CHECKS})
        .bind(raw, base.name, trainer)
        for base in config.base_models
        for trainer in base.trainer_groups()
    }
    samplers = {
        base.name: serve.deployment()(Sampler)
        .options(**{**Sampler.deployment_options(config, base.name), **REPLICA_CHECKS})
        .bind(
            raw,
            base.name,
            int(limits[base.name]["max_context_length"]),
            trainers[base.name] if base.sampler_starts_after_trainer(len(os.sched_getaffinity(0))) else None,
        )
        for base in config.base_models
    }
    ingress = serve.deployment()(serve.ingress()(Ingress)).options(
        **{**Ingress.deployment_options(config), **REPLICA_CHECKS}
    )
    return ingress.bind(raw, trainers, samplers, limits)
