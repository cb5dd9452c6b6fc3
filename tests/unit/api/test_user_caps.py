"""What one user may keep (issue 45 #10, #11; app.api.user_caps): sessions, training runs, the bytes of their
metadata, ephemeral samplers and stability records are capped per user, each refusal naming its quota before
anything is recorded; listings bound the metadata of a page."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
from sqlalchemy import update

from app.api.retention import prune_old_metadata
from app.db.metadata import TrainingRun, model_id_for
from app.db.outcomes import Failed, Pending
from app.db.sampling_sessions import SamplingSession
from app.db.schema import sessions, training_runs
from app.db.stability import StabilityRecord
from tests.unit.api.conftest import BASE_MODEL, InProcessApi, new_session, saved_checkpoint
from tests.unit.api.test_hostile_inputs import refused

LORA = {"rank": 4, "seed": 1, "train_attn": True, "train_mlp": True, "optimizer": "adamw"}
DAY = 86400.0
META = {"k": "v"}


def _quota_refused(response: Any, field: str, quota: str) -> None:
    assert f"quotas.{quota}=" in refused(response, field)["error"]


def _age(api: InProcessApi, table: Any, days: float) -> None:
    """Every row of `table` created `days` ago."""

    async def age() -> None:
        async with api.services.metadata._db.begin() as conn:
            await conn.execute(update(table).values(created_at=time.time() - days * DAY))

    api.run(age())


def _run(api: InProcessApi, session_id: str, seq: int, metadata: dict, unloaded: bool = True) -> str:
    """A training run recorded as create_model records it (its trainer out of scope)."""
    model_id = model_id_for(session_id, seq)
    run = TrainingRun(model_id, session_id, BASE_MODEL, 4, "policy", BASE_MODEL, LORA, metadata, time.time(), unloaded)
    api.run(api.services.metadata.add_training_run(run))
    return model_id


def _create_model(api: InProcessApi, session_id: str, seq: int, metadata: dict | None = None) -> Any:
    body = {"session_id": session_id, "model_seq_id": seq, "base_model": BASE_MODEL, "user_metadata": metadata}
    return api.post("/api/v1/create_model", body)


def test_sessions_per_user_are_capped_until_finished_ones_age_out(make_api: Callable[..., InProcessApi]) -> None:
    api = make_api(max_sessions_per_user=2)
    first, _ = new_session(api), new_session(api)
    _quota_refused(api.post("/api/v1/create_session", {"tags": []}), "session_id", "max_sessions_per_user")
    new_session(api, "bob")  # another user's room is their own
    assert api.post(f"/api/v1/sessions/{first}/finish", {}).status_code == 200
    _quota_refused(api.post("/api/v1/create_session", {"tags": []}), "session_id", "max_sessions_per_user")
    _age(api, sessions, days=31)  # past retention.metadata_retention_seconds: the finished one stops counting
    new_session(api)
    _quota_refused(api.post("/api/v1/create_session", {"tags": []}), "session_id", "max_sessions_per_user")


def test_training_runs_per_user_are_capped(make_api: Callable[..., InProcessApi]) -> None:
    api = make_api(max_training_runs_per_user=1)
    session_id = new_session(api)
    _run(api, session_id, 0, {})  # unloaded, but kept until its metadata is pruned
    _quota_refused(_create_model(api, session_id, 1), "model_seq_id", "max_training_runs_per_user")
    _age(api, training_runs, days=31)
    api.services.trainers = SimpleNamespace(create_model=lambda *args: None)  # type: ignore[assignment]
    assert _create_model(api, session_id, 1).status_code == 200


def test_metadata_bytes_per_user_are_capped(make_api: Callable[..., InProcessApi]) -> None:
    api = make_api(max_metadata_bytes_per_user=2500)  # one session of ~1.4 KB fits
    metadata = {"k": "v" * 1400}
    session_id = api.post("/api/v1/create_session", {"tags": ["t"], "user_metadata": metadata}).json()["session_id"]
    _quota_refused(
        api.post("/api/v1/create_session", {"tags": [], "user_metadata": metadata}),
        "user_metadata",
        "max_metadata_bytes_per_user",
    )
    _quota_refused(_create_model(api, session_id, 0, metadata), "user_metadata", "max_metadata_bytes_per_user")
    assert api.post("/api/v1/create_session", {"tags": []}, "bob").status_code == 200


def _save_for_sampler(api: InProcessApi, model_id: str, seq: int) -> Any:
    """An ephemeral save_weights_for_sampler's future (the trainer out of scope: it stays pending, or failed)."""
    body = {"model_id": model_id, "seq_id": seq, "sampling_session_seq_id": seq}
    request_id = api.post("/api/v1/save_weights_for_sampler", body).json()["request_id"]
    return api.run(api.services.futures.get(request_id))


def _refusal(outcome: Any) -> str:
    """A failed future's user error."""
    assert isinstance(outcome, Failed), outcome
    assert outcome.error["category"] == "user", outcome.error
    return str(outcome.error["error"])


def test_ephemeral_samplers_are_capped_per_user(make_api: Callable[..., InProcessApi]) -> None:
    api = make_api(max_ephemeral_samplers_per_user=1)
    api.services.trainers = SimpleNamespace(submit=lambda *args: None)  # type: ignore[assignment]
    model_id = saved_checkpoint(api, "alice").model_id
    assert isinstance(_save_for_sampler(api, model_id, 1), Pending)  # the trainer has it
    assert "quotas.max_ephemeral_samplers_per_user=1" in _refusal(_save_for_sampler(api, model_id, 2))
    assert len(api.run(api.services.sampler_store.expired(0.0, time.time() + 1))) == 1  # the refused one: no row


def test_ephemeral_saves_count_against_the_checkpoint_bytes(make_api: Callable[..., InProcessApi]) -> None:
    api = make_api(max_checkpoint_bytes_per_user=10)
    api.services.trainers = SimpleNamespace(submit=lambda *args: None)  # type: ignore[assignment]
    model_id = saved_checkpoint(api, "alice", size_bytes=10).model_id  # the whole quota
    assert "quotas.max_checkpoint_bytes_per_user=10" in _refusal(_save_for_sampler(api, model_id, 1))


def _sampler_of(api: InProcessApi, user: str = "alice") -> str:
    session_id = new_session(api, user)
    sampler = SamplingSession(f"{session_id}:sample:0", session_id, BASE_MODEL, None, None, False, time.time())
    return api.run(api.services.sampler_store.create(sampler)).sampling_session_id


def _sample(api: InProcessApi, sampler_id: str, prompt_tokens: int, user: str = "alice") -> Any:
    body = {
        "sampling_session_id": sampler_id,
        "seq_id": 0,
        "num_samples": 4,
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1] * prompt_tokens}]},
        "sampling_params": {"max_tokens": 8},
        "record_stability_info": True,
    }
    return api.post("/api/v1/asample", body, user)


def test_stability_records_are_charged_by_bytes_per_user(make_api: Callable[..., InProcessApi]) -> None:
    """4 samples of 8 tokens: 256 bytes of records plus 16 a prompt token; the user's live records count too."""
    api = make_api(max_stability_record_bytes_per_user=700)
    queued: list[tuple] = []
    api.services.samplers = SimpleNamespace(  # type: ignore[assignment]
        admit=lambda *args: True, release=lambda *args: None, sample=lambda *args: queued.append(args)
    )
    sampler_id = _sampler_of(api)
    _quota_refused(_sample(api, sampler_id, 30), "record_stability_info", "max_stability_record_bytes_per_user")
    assert _sample(api, sampler_id, 10).status_code == 200  # 416 bytes
    session_id = sampler_id.split(":")[0]
    held = np.zeros(50, dtype=np.int32)  # 200 + 200 + 200 bytes
    record = StabilityRecord("r:0", session_id, None, held, held, held.astype(np.float32))
    api.run(api.services.stability.add([record]))
    _quota_refused(_sample(api, sampler_id, 10), "record_stability_info", "max_stability_record_bytes_per_user")
    assert _sample(api, _sampler_of(api, "bob"), 10, "bob").status_code == 200  # alice's records are hers
    assert len(queued) == 2


def test_a_listing_page_bounds_the_metadata_it_shows(make_api: Callable[..., InProcessApi]) -> None:
    api = make_api(max_listing_metadata_bytes=4096)
    session_id = new_session(api)
    metadata = {f"k{i}": "v" * 200 for i in range(10)}  # ~2.2 KB each
    model_ids = [_run(api, session_id, seq, metadata) for seq in range(20)]
    page = api.get("/api/v1/training_runs", params={"limit": 20})
    runs = page.json()["training_runs"]
    assert len(runs) == 20 and all(r["user_metadata_truncated"] for r in runs)
    assert sum(len(json.dumps(r["user_metadata"])) for r in runs) <= 4096
    assert len(page.content) < 4096 + 20 * 400  # the rest of each run's view
    one = api.get("/api/v1/training_runs", params={"limit": 1}).json()["training_runs"][0]
    assert one["user_metadata"] == metadata and "user_metadata_truncated" not in one  # a small page: whole
    assert api.get(f"/api/v1/training_runs/{model_ids[0]}").json()["user_metadata"] == metadata


def test_the_retention_sweep_prunes_old_metadata_and_keeps_recent(api: InProcessApi) -> None:
    old_session = api.post("/api/v1/create_session", {"tags": [], "user_metadata": META}).json()["session_id"]
    old_run, live_run = _run(api, old_session, 0, META), _run(api, old_session, 1, META, unloaded=False)
    api.run(api.services.metadata.finish_session(old_session, "success"))  # its live model's unload out of scope
    _age(api, sessions, days=31)
    _age(api, training_runs, days=31)
    recent_run = _run(api, new_session(api), 0, META)
    assert api.run(prune_old_metadata(api.services)) == 2  # the old session's and the old unloaded run's
    shown = {r["training_run_id"]: r["user_metadata"] for r in api.get("/api/v1/training_runs").json()["training_runs"]}
    assert shown == {old_run: {}, live_run: META, recent_run: META}
