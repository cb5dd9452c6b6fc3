"""The real API in process: `create_api()` over every real store on a SQLite file and object storage in a tmp dir.

Trainers and samplers are None, so routes that reach them are out of scope; auth is any_tml_key_on_loopback and
the client calls from 127.0.0.1, so any `tml-` key is its own user.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.auth import Authenticator
from app.api.deps import Services
from app.api.main import create_api
from app.api.rates import RateLimiter
from app.api.tokens import TokenSigner
from app.config import MOVED_FROM_LIMITS, ServerConfig
from app.db.audit import AuditLog
from app.db.checkpoints import CheckpointRecord, CheckpointStore
from app.db.copies import CopyLog
from app.db.custom_losses import CustomLossStore
from app.db.futures import FutureStore
from app.db.history import HistoryStore
from app.db.journal import JournalStore
from app.db.keys import KeyStore, enrolled_owner
from app.db.metadata import MetadataStore, TrainingRun, model_id_for
from app.db.quotas import QuotaStore
from app.db.sampling_sessions import SamplingSessionStore
from app.db.schema import connect
from app.db.session_views import SessionViews
from app.db.stability import StabilityStore
from app.db.traces import TraceStore
from app.db.usage import UsageStore
from app.storage.objects import ObjectStorage
from app.storage.paths import CheckpointPath
from app.training_data.validation import ModelLimits
from tests.conftest import run_on_db, sqlite_url

T = TypeVar("T")
BASE_MODEL = "tiny"
VOCAB_SIZE = 1000


async def _awaited(coroutine: Coroutine[Any, Any, T]) -> T:
    return await coroutine


@dataclass
class InProcessApi:
    """The app's client (key `tml-alice` unless a call sends another), its Services, and a way to run store calls
    on the app's own event loop (the TestClient's portal: aiosqlite connections belong to one loop)."""

    client: TestClient
    services: Services
    run: Callable[[Coroutine[Any, Any, T]], T]

    def headers(self, user: str = "alice") -> dict[str, str]:
        return {"X-API-Key": f"tml-{user}"}

    def post(self, path: str, body: dict, user: str = "alice", headers: dict[str, str] | None = None) -> Any:
        """POST `body` as JSON as Python writes it (non-finite floats as Infinity and NaN, which the app parses)."""
        sent = {**self.headers(user), "Content-Type": "application/json", **(headers or {})}
        return self.client.post(path, content=json.dumps(body), headers=sent)

    def get(self, path: str, user: str = "alice", **kwargs: Any) -> Any:
        return self.client.get(path, headers=self.headers(user), **kwargs)

    @staticmethod
    def user_id(user: str = "alice") -> str:
        """The user id that the key `tml-{user}` enrolls as."""
        return enrolled_owner(f"tml-{user}")


def services_over(db: AsyncEngine, config: ServerConfig, storage_root: Path) -> Services:
    """Services with every store real over `db`; no trainers or samplers."""
    quotas, futures, audit = config.quotas, FutureStore(db, poll_interval_s=0.05), AuditLog(db)
    return Services(
        config=config,
        futures=futures,
        metadata=MetadataStore(db),
        checkpoints=CheckpointStore(db),
        storage=ObjectStorage(str(storage_root)),
        trainers=None,  # type: ignore[arg-type]  # routes that reach a trainer are out of scope
        sampler_store=SamplingSessionStore(db),
        stability=StabilityStore(db),
        journal=JournalStore(db),
        history=HistoryStore(db, config.retention.max_history_points_per_run),
        session_views=SessionViews(db),
        traces=TraceStore(db),
        usage=UsageStore(db),
        copies=CopyLog(db),
        custom_losses=CustomLossStore(db),
        samplers=None,  # type: ignore[arg-type]
        model_limits={BASE_MODEL: ModelLimits(vocab_size=VOCAB_SIZE, max_context_length=2048)},
        auth=Authenticator("any_tml_key_on_loopback", frozenset(), KeyStore(db), 0, audit, TokenSigner("s" * 32)),
        audit=audit,
        quotas=QuotaStore(db),
        request_rate=RateLimiter(quotas.requests_per_minute_per_key),
        sample_rate=RateLimiter(quotas.sample_tokens_per_minute_per_user),
        failed_auth_rate=RateLimiter(quotas.failed_auth_per_minute_per_client),
        url_signing_key="k",
    )


def new_session(api: InProcessApi, user: str = "alice") -> str:
    response = api.post("/api/v1/create_session", {"tags": []}, user)
    assert response.status_code == 200, response.text
    return str(response.json()["session_id"])


def saved_checkpoint(api: InProcessApi, user: str, size_bytes: int = 10, public: bool = False) -> CheckpointPath:
    """A run of `user`'s with one saved training checkpoint (files on storage): what the trainer would leave."""
    session_id = new_session(api, user)
    model_id = model_id_for(session_id, 0)
    lora = {"rank": 4, "seed": 1, "train_attn": True, "train_mlp": True, "optimizer": "adamw"}
    run = TrainingRun(model_id, session_id, BASE_MODEL, 4, "policy", BASE_MODEL, lora, {}, time.time(), True)
    api.run(api.services.metadata.add_training_run(run))
    path = CheckpointPath(model_id, "weights", "step-1")
    location = path.new_location()

    def build(out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "adapter_model.safetensors").write_bytes(b"x" * size_bytes)

    api.services.storage.write(location, build)
    record = CheckpointRecord(path, location, size_bytes, time.time(), public=public)
    api.run(api.services.checkpoints.commit(record, overwrite=False))
    return path


@pytest.fixture
def make_api(tmp_path: Path) -> Iterator[Callable[..., InProcessApi]]:
    """Makes the in-process API; keyword arguments override config fields of the server-wide sections by name
    (limits, timeouts, retention, quotas, engine: each name is in one of them), `users` is quotas.users."""
    path = tmp_path / "api.sqlite"
    run_on_db(path, lambda db: asyncio.sleep(0))  # the tables
    clients: list[TestClient] = []

    def make(users: dict[str, dict[str, int]] | None = None, **overrides: Any) -> InProcessApi:
        sections: dict[str, dict[str, Any]] = {"quotas": {"users": users or {}}}  # users: quotas.users
        for name, value in overrides.items():
            sections.setdefault(MOVED_FROM_LIMITS.get(name, "limits"), {})[name] = value
        config = ServerConfig(
            base_models=[{"name": BASE_MODEL, "path": "models/tiny"}],
            auth={"mode": "any_tml_key_on_loopback"},
            **sections,
        )
        api = create_api()
        api.state.services = services = services_over(connect(sqlite_url(path)), config, tmp_path / "objects")
        client = TestClient(api, base_url="http://127.0.0.1:8000", client=("127.0.0.1", 40000))
        clients.append(client.__enter__())
        portal = client.portal
        assert portal is not None
        return InProcessApi(client, services, lambda coroutine: portal.call(_awaited, coroutine))

    yield make
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture
def api(make_api: Callable[..., InProcessApi]) -> InProcessApi:
    """The in-process API with the default limits."""
    return make_api()
