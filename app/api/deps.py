"""Collaborators of the routers, reached through one `Services` object held on the app."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Annotated

from fastapi import Depends, Request

from app.api.backends import SamplerClient, TrainerClient
from app.config import BaseModelConfig, ServerConfig
from app.db.checkpoints import CheckpointRecord, CheckpointStore
from app.db.copies import CopyLog
from app.db.custom_losses import CustomLossStore
from app.db.futures import FutureStore
from app.db.metadata import MetadataStore, TrainingRun
from app.db.samplers import SamplerStore, SamplingSession
from app.db.session_views import SessionViews
from app.db.stability import StabilityStore
from app.db.traces import TraceStore
from app.db.usage import UsageStore
from app.errors import NotFound, UserError
from app.storage.objects import ObjectStorage
from app.storage.paths import KINDS, parse_tinker_path
from app.training.validation import ModelLimits


@dataclass
class Services:
    config: ServerConfig
    futures: FutureStore
    metadata: MetadataStore
    checkpoints: CheckpointStore
    storage: ObjectStorage  # checkpoint files (blocking: call through asyncio.to_thread)
    trainers: TrainerClient
    sampler_store: SamplerStore
    stability: StabilityStore  # stability records of sampled sequences (stable_reinforce)
    session_views: SessionViews  # sessions for the REST views
    traces: TraceStore  # a session's requests and their timings
    usage: UsageStore  # tokens trained and sampled; checkpoint storage
    copies: CopyLog  # copy_weights by idempotency key
    custom_losses: CustomLossStore  # losses made by create_custom_loss
    samplers: SamplerClient
    model_limits: dict[str, ModelLimits]  # by base model name
    api_keys: frozenset[str]
    url_signing_key: str  # signs download URLs; shared by every ingress replica (see app.db.settings)
    _runs: dict[str, TrainingRun] = field(default_factory=dict)
    _sampling_sessions: dict[str, SamplingSession] = field(default_factory=dict)

    def served_base_model(self, name: str) -> BaseModelConfig:
        """The configured base model called `name`; a user error listing the served ones otherwise."""
        base = self.config.base_model(name)
        if base is None:
            served = [m.name for m in self.config.base_models]
            raise UserError(f"base_model {name!r} is not served here; available: {served}", field="base_model")
        return base

    async def training_run(self, model_id: str) -> TrainingRun:
        """The run behind a model id (cached; runs never change base model)."""
        run = self._runs.get(model_id)
        if run is None:
            run = await self.metadata.get_training_run(model_id)
            self._runs[model_id] = run
        return run

    async def saved_by(
        self, uri: str, *, field: str, kinds: tuple[str, ...] = KINDS, hint: str = ""
    ) -> tuple[CheckpointRecord, TrainingRun]:
        """The live checkpoint at a tinker path of one of `kinds`, and the run that saved it; user errors
        naming `field` otherwise (`hint` says what to send instead of another kind)."""
        path = parse_tinker_path(uri, field=field)
        if path.kind not in kinds:
            raise UserError(f"{uri!r} is a {path.kind} checkpoint; {hint}", field=field)
        try:
            run = await self.training_run(path.model_id)
        except NotFound:
            raise NotFound(f"{field} {uri!r}: no training run {path.model_id!r}", field=field) from None
        return await self.checkpoints.get(path, field=field), run

    async def sampling_session(self, sampling_session_id: str) -> SamplingSession:
        """A live sampling session; using an ephemeral one keeps it from expiring."""
        session = self._sampling_sessions.get(sampling_session_id)
        if session is None:
            session = await self.sampler_store.get(sampling_session_id)
        if session.ephemeral:
            ttl, now = self.config.limits.ephemeral_sampler_ttl_seconds, time.time()
            if now - session.last_used_at > ttl / 10:  # refresh rarely: another replica may have used it
                session = await self.sampler_store.get(sampling_session_id)
                if now - session.last_used_at > ttl:
                    raise NotFound(
                        f"sampling session {sampling_session_id!r} expired after {ttl:g} s unused; "
                        "call save_weights_and_get_sampling_client again",
                        field="sampling_session_id",
                    )
                await self.sampler_store.touch(sampling_session_id, now)
                session = replace(session, last_used_at=now)
        if len(self._sampling_sessions) > 10_000:  # RL makes one per step: keep the cache bounded
            self._sampling_sessions.clear()
        self._sampling_sessions[sampling_session_id] = session
        return session


def get_services(request: Request) -> Services:
    return request.app.state.services


ServicesDep = Annotated[Services, Depends(get_services)]
