"""Collaborators of the routers, reached through one `Services` object held on the app."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace
from typing import Annotated

from fastapi import Depends, Query, Request

from app.api.auth import Authenticator
from app.api.backends import ReplicaCounts, SamplerClient, TrainerClient
from app.api.rates import RateLimiter
from app.caches import remember
from app.config import BaseModelConfig, ServerConfig
from app.db.audit import AuditLog
from app.db.checkpoint_search import CheckpointSearch
from app.db.checkpoints import CheckpointRecord, CheckpointStore
from app.db.copies import CopyLog
from app.db.custom_losses import CustomLossStore
from app.db.futures import FutureStore, future_not_found
from app.db.history import HistoryStore
from app.db.journal import JournalStore
from app.db.metadata import MetadataStore, TrainingRun, model_not_found, session_not_found
from app.db.quotas import QuotaStore
from app.db.sampling_sessions import SamplingSession, SamplingSessionStore, sampler_not_found
from app.db.session_views import SessionViews
from app.db.stability import StabilityStore
from app.db.traces import TraceStore
from app.db.uploads import UploadStore
from app.db.usage import UsageStore
from app.errors import NotFound, UserError
from app.protocol.wire import INT64_MAX
from app.storage.objects import ObjectStorage
from app.storage.paths import KINDS, parse_tinker_path
from app.training_data.validation import ModelLimits

# what reading another user's published checkpoint was for, by the request field that named it
_PURPOSES = {
    "model_path": "sample",
    "model": "sample",  # the OpenAI-compatible routes
    "path": "load",
    "source_path": "copy",
    "tinker_path": "weights_info",
    "checkpoint_id": "download",
}


@dataclass
class Admitting:
    """A user's training operations being admitted on this replica: one at a time (`lock`), from the quota check to
    its journal row, so each check counts every operation admitted before it. `present`: the requests holding or
    waiting for the lock (the entry goes with the last)."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    present: int = 0


@dataclass
class Services:
    config: ServerConfig
    futures: FutureStore
    metadata: MetadataStore
    checkpoints: CheckpointStore
    checkpoint_search: CheckpointSearch  # search_checkpoints
    storage: ObjectStorage  # checkpoint files (blocking: call through asyncio.to_thread)
    trainers: TrainerClient
    sampler_store: SamplingSessionStore
    stability: StabilityStore  # stability records of sampled sequences (stable_reinforce)
    journal: JournalStore  # each model's accepted operations, appended before its trainer gets them
    history: HistoryStore  # each model's finished training steps and their metrics (written by its trainer)
    session_views: SessionViews  # sessions for the REST views
    traces: TraceStore  # a session's requests and their timings
    usage: UsageStore  # tokens trained and sampled; checkpoint storage
    copies: CopyLog  # copy_weights by idempotency key
    uploads: UploadStore  # adapters being uploaded (app.api.uploads)
    custom_losses: CustomLossStore  # losses made by create_custom_loss
    samplers: SamplerClient
    model_limits: dict[str, ModelLimits]  # by base model name
    auth: Authenticator  # API key -> user
    audit: AuditLog  # who did what (app.api.audit)
    quotas: QuotaStore  # what each user holds (app.api.quotas)
    request_rate: RateLimiter  # requests a minute, per key
    sample_rate: RateLimiter  # sampled tokens a minute, per user
    failed_auth_rate: RateLimiter  # refused keys a minute, per client address
    url_signing_key: str  # signs download URLs; shared by every ingress replica (see app.db.settings)
    replicas: ReplicaCounts | None = None  # the deployments' replicas (server_status); None: not known here
    long_polls: dict[str, int] = field(default_factory=dict)  # user -> retrieve_future(s) waiting on this replica
    admitting: dict[str, Admitting] = field(default_factory=dict)  # user -> operations being admitted (app.api.quotas)
    _runs: dict[str, TrainingRun] = field(default_factory=dict)
    _sampling_sessions: dict[str, SamplingSession] = field(default_factory=dict)
    _owners: dict[str, str | None] = field(default_factory=dict)  # session id -> owner (owners never change)
    _reads_audited: dict[tuple[str, str, str], float] = field(default_factory=dict)  # (reader, path, purpose) -> when

    def served_base_model(self, name: str) -> BaseModelConfig:
        """The configured base model called `name`; a user error listing the served ones otherwise."""
        base = self.config.base_model(name)
        if base is None:
            served = [m.name for m in self.config.base_models]
            raise UserError(f"base_model {name!r} is not served here; available: {served}", field="base_model")
        return base

    async def owns(self, user: str, session_id: str) -> bool:
        """Whether the session exists and `user` may use it and what it holds (its models, sampling sessions,
        checkpoints, futures): theirs, or made before owners were recorded."""
        if session_id not in self._owners:
            try:
                owner = await self.metadata.owner_of(session_id)
            except NotFound:
                return False
            remember(self._owners, session_id, owner)
        owner = self._owners[session_id]
        return owner is None or owner == user

    async def session(self, session_id: str, user: str) -> None:
        """Check that `user` may use the session; another user's answers as a missing one does."""
        if not await self.owns(user, session_id):
            raise session_not_found(session_id)

    async def future(self, request_id: str, user: str) -> None:
        """Check that a future is `user`'s; another user's answers as an unknown one does."""
        session_id = await self.futures.session_of(request_id)  # cached there
        if session_id is None or not await self.owns(user, session_id):
            raise future_not_found(request_id)

    async def _run(self, model_id: str) -> TrainingRun:
        """The run behind a model id, whoever owns it (cached; runs never change base model or session)."""
        run = self._runs.get(model_id)
        if run is None:
            run = remember(self._runs, model_id, await self.metadata.get_training_run(model_id))
        return run

    async def training_run(self, model_id: str, user: str) -> TrainingRun:
        """The run behind a model id of `user`'s; another user's answers as a missing one does."""
        run = await self._run(model_id)
        if not await self.owns(user, run.session_id):
            raise model_not_found(model_id)
        return run

    async def saved_by(
        self, uri: str, user: str, *, field: str, kinds: tuple[str, ...] = KINDS, hint: str = ""
    ) -> tuple[CheckpointRecord, TrainingRun]:
        """The live checkpoint at a tinker path of one of `kinds` that `user` may read (theirs, or published),
        and the run that saved it; user errors naming `field` otherwise (`hint` says what to send instead of
        another kind). Another user's unpublished checkpoint answers as a missing run does."""
        path = parse_tinker_path(uri, field=field)
        if path.kind not in kinds:
            raise UserError(f"{uri!r} is a {path.kind} checkpoint; {hint}", field=field)
        no_run = NotFound(f"{field} {uri!r}: no training run {path.model_id!r}", field=field)
        try:
            run = await self._run(path.model_id)
        except NotFound:
            raise no_run from None
        owned = await self.owns(user, run.session_id)
        record = await self.checkpoints.find(path)
        if record is not None and owned:
            return record, run
        if record is not None and record.public:
            await self.audit_read(user, record, run, purpose=_PURPOSES.get(field, field))
            return record, run
        if not owned:
            raise no_run
        return await self.checkpoints.get(path, field=field), run  # its own message: never saved, deleted, expired

    async def audit_read(self, user: str, record: CheckpointRecord, run: TrainingRun, purpose: str) -> None:
        """Record `user` reading another user's published checkpoint (their owner reads it in their audit log), once
        per retention.audit_read_dedupe_seconds for each checkpoint and purpose: reads in a loop do not flood the
        log."""
        now, read = time.monotonic(), (user, record.path.uri, purpose)
        last = self._reads_audited.get(read)
        if last is not None and now - last < self.config.retention.audit_read_dedupe_seconds:
            return
        remember(self._reads_audited, read, now)
        owner = self._owners.get(run.session_id)
        details = {"tinker_path": record.path.uri, "model_id": run.model_id, "purpose": purpose}
        await self.audit.record("checkpoint_read", user, details, subject_owner=owner)

    async def sampling_session(self, sampling_session_id: str, user: str) -> SamplingSession:
        """A live sampling session of `user`'s; using an ephemeral one keeps it from expiring. Another user's
        answers as a missing one does."""
        session = self._sampling_sessions.get(sampling_session_id)
        if session is None:
            session = await self.sampler_store.get(sampling_session_id)
        if not await self.owns(user, session.session_id):
            raise sampler_not_found(sampling_session_id)
        if session.ephemeral:
            ttl, now = self.config.retention.ephemeral_sampler_ttl_seconds, time.time()
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
        return remember(self._sampling_sessions, sampling_session_id, session, limit=10_000)  # RL makes one a step


# Dependencies are coroutines: FastAPI runs a plain `def` dependency on its thread pool, two thread hops per request
# (bench/request_path.py: a keyed route took twice a keyless one's time through Serve's proxy).
async def get_services(request: Request) -> Services:
    return request.app.state.services


async def get_user(request: Request) -> str:
    """The caller's user id, set by app.api.gate.RequestGate on every route that needs a key."""
    user = request.state.user
    if user is None:  # a route that needs no key never asks for the user
        raise RuntimeError(f"{request.url.path} has no authenticated user")
    return str(user)


ServicesDep = Annotated[Services, Depends(get_services)]
UserDep = Annotated[str, Depends(get_user)]
OffsetQuery = Annotated[int, Query(ge=0, le=INT64_MAX)]  # listings' offset: any row count the database holds
