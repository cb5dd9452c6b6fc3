"""The real API in process: the ingress's own wiring (app.api.wiring: `ingress_app` and `build_services`) over a
SQLite file and object storage in a tmp dir.

Trainers and samplers are None, so routes that reach them are out of scope; auth is any_tml_key_on_loopback and
the client calls from 127.0.0.1, so any `tml-` key is its own user.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from fastapi.testclient import TestClient

from app.api.deps import Services
from app.api.wiring import build_services, ingress_app
from app.config import MOVED_FROM_LIMITS, ServerConfig
from app.db.checkpoints import CheckpointRecord
from app.db.keys import enrolled_owner
from app.db.metadata import TrainingRun, model_id_for
from app.storage.paths import CheckpointPath
from app.training_data.validation import ModelLimits
from tests.conftest import sqlite_url

T = TypeVar("T")
BASE_MODEL = "tiny"
VOCAB_SIZE = 1000


def _no_backend(*_: object) -> Any:
    return None


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
    (limits, timeouts, retention, quotas, engine: each name is in one of them), `users` is quotas.users, `images`
    the images section."""
    database, storage = sqlite_url(tmp_path / "api.sqlite"), str(tmp_path / "objects")
    clients: list[TestClient] = []

    def make(
        users: dict[str, dict[str, int]] | None = None, images: dict[str, Any] | None = None, **overrides: Any
    ) -> InProcessApi:
        sections: dict[str, dict[str, Any]] = {"quotas": {"users": users or {}}}  # users: quotas.users
        if images is not None:
            sections["images"] = images
        for name, value in overrides.items():
            sections.setdefault(MOVED_FROM_LIMITS.get(name, "limits"), {})[name] = value
        config = ServerConfig(
            base_models=[{"name": BASE_MODEL, "path": "models/tiny"}],
            auth={"mode": "any_tml_key_on_loopback", "key_cache_seconds": 0},
            database_url=database,
            storage_uri=storage,
            **sections,
        )
        api = ingress_app(config)
        client = TestClient(api, base_url="http://127.0.0.1:8000", client=("127.0.0.1", 40000))
        clients.append(client.__enter__())
        portal = client.portal
        assert portal is not None
        limits = {BASE_MODEL: ModelLimits(vocab_size=VOCAB_SIZE, max_context_length=2048)}
        # on the app's own loop (its database connections belong to it); no trainers or samplers: routes that
        # reach them are out of scope

        def run(coroutine: Coroutine[Any, Any, T]) -> T:
            return portal.call(_awaited, coroutine)

        api.state.services = services = run(
            build_services(config, _no_backend, _no_backend, limits, future_poll_s=0.05)
        )
        return InProcessApi(client, services, run)

    yield make
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture
def api(make_api: Callable[..., InProcessApi]) -> InProcessApi:
    """The in-process API with the default limits."""
    return make_api()
