"""Hostile inputs through the in-process app (tests/unit/api/conftest.py): each is a 4xx naming the field or the
limit, never a 500, and nothing is written or queued first."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.unit.api.conftest import BASE_MODEL, InProcessApi, new_session, saved_checkpoint


def refused(response: Any, field: str, status: int = 400) -> dict:
    """The error body of a refusal naming `field` (Tinker's shape, or OpenAI's `param` on /v1/)."""
    assert response.status_code == status, response.text
    body = response.json()
    named = body["error"]["param"] if "error" in body and isinstance(body["error"], dict) else body["field"]
    assert named == field, body
    return body


def test_audit_of_the_last_day_is_a_user_error(api: InProcessApi) -> None:
    refused(api.get("/api/v1/audit", params={"day": "9999-12-31"}), "day")
    assert api.get("/api/v1/audit", params={"day": "9999-12-30"}).json()["entries"] == []


def test_session_search_cursors_out_of_range(api: InProcessApi) -> None:
    new_session(api)
    search = "/api/v1/sessions/search"
    naive_year_one = {"cursor": {"last_created_at": "0001-01-01T00:00:00", "last_session_id": "x"}}
    assert api.post(search, naive_year_one).json()["sessions"] == []  # UTC: nothing is older
    malformed = {"cursor": {"last_created_at": "yesterday", "last_session_id": "x"}}
    refused(api.post(search, malformed), "cursor.last_created_at")


def test_session_search_bounds_project_ids(api: InProcessApi) -> None:
    search = "/api/v1/sessions/search"
    refused(api.post(search, {"project_ids": [f"p{i}" for i in range(50_000)]}), "project_ids")  # under 1 MiB
    refused(api.post(search, {"project_ids": ["p" * 201]}), "project_ids.0")
    assert api.post(search, {"project_ids": [f"p{i}" for i in range(1000)]}).status_code == 200


@pytest.mark.parametrize("seed", [2**64, -(2**63) - 1])
def test_lora_seed_beyond_64_bits(api: InProcessApi, seed: int) -> None:
    body = {"session_id": new_session(api), "model_seq_id": 0, "base_model": BASE_MODEL, "lora_config": {"seed": seed}}
    refused(api.post("/api/v1/create_model", body), "lora_config.seed")
    assert api.run(api.services.quotas.live_models(api.user_id())) == 0  # nothing counts against the user


def test_admin_key_id_beyond_int64(make_api: Callable[..., InProcessApi]) -> None:
    api = make_api()
    api.services.config.auth.admin_users.append(api.user_id())
    refused(api.client.delete(f"/api/v1/admin/keys/{2**63}", headers=api.headers()), "path.key_id")


def _sampling_session(api: InProcessApi) -> str:
    body = {"session_id": new_session(api), "sampling_session_seq_id": 0, "base_model": BASE_MODEL}
    response = api.post("/api/v1/create_sampling_session", body)
    assert response.status_code == 200, response.text
    return str(response.json()["sampling_session_id"])


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"temperature": float("inf")}, "sampling_params.temperature"),
        ({"temperature": 2.5}, "sampling_params.temperature"),
    ],
)
def test_asample_sampling_params_out_of_range(api: InProcessApi, params: dict, field: str) -> None:
    body = {
        "sampling_session_id": _sampling_session(api),
        "seq_id": 0,
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2]}]},
        "sampling_params": {"max_tokens": 4, **params},
    }
    refused(api.post("/api/v1/asample", body), field)


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"temperature": float("inf")}, "temperature"),
        ({"temperature": 3}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_k": -5}, "top_k"),
    ],
)
def test_openai_sampling_params_out_of_range(api: InProcessApi, params: dict, field: str) -> None:
    body = {"model": BASE_MODEL, "prompt": "hi", "max_tokens": 4, **params}
    refused(api.post("/v1/completions", body), field)
    chat = {"model": BASE_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **params}
    refused(api.post("/v1/chat/completions", chat), field)


def test_completions_bound_prompts_times_n(make_api: Callable[..., InProcessApi]) -> None:
    api = make_api(sample_tokens_per_minute_per_user=1000)
    many = {"model": BASE_MODEL, "prompt": ["hi"] * 100_000, "n": 64, "max_tokens": 1}
    body = refused(api.post("/v1/completions", many), "n")
    assert "limits.max_num_samples" in body["error"]["message"]
    # larger than a whole minute's tokens: refused, not admitted on a full bucket
    big = {"model": BASE_MODEL, "prompt": [[1, 2]] * 4, "n": 2, "max_tokens": 200}
    body = refused(api.post("/v1/completions", big), "max_tokens")
    assert "quotas.sample_tokens_per_minute_per_user" in body["error"]["message"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"sdk_version": "1" * 33}, "sdk_version"),
        ({"project_id": "p" * 201}, "project_id"),
        ({"display_name": "d" * 401}, "display_name"),
        ({"user_metadata": {"k": "v" * 20_000}}, "user_metadata"),
        ({"tags": ["t" * 10_000, "u" * 10_000]}, "tags"),
    ],
)
def test_create_session_bounds_what_it_stores(api: InProcessApi, body: dict, field: str) -> None:
    refused(api.post("/api/v1/create_session", body), field)
    assert api.get("/api/v1/sessions").json()["sessions"] == []


def test_session_fields_stored_in_bounded_columns(api: InProcessApi) -> None:
    session_id = new_session(api)
    moved = api.client.put(
        f"/api/v1/sessions/{session_id}/project", json={"project_id": "p" * 201}, headers=api.headers()
    )
    refused(moved, "project_id")
    finish = api.post(f"/api/v1/sessions/{session_id}/finish", {"reason": {"type": "r" * 33}})
    refused(finish, "reason.type")
    loss = {"session_id": session_id, "custom_loss_seq_id": 0, "name": "n" * 201, "inputs": [], "graph": {}}
    refused(api.post("/api/v1/create_custom_loss", loss), "name")


def test_copy_weights_checks_the_key_and_the_quota_before_copying(make_api: Callable[..., InProcessApi]) -> None:
    api = make_api(max_checkpoint_bytes_per_user=120)
    source = saved_checkpoint(api, "alice", size_bytes=60)
    body = {"source_path": source.uri}
    long_key = {"X-Idempotency-Key": "k" * 129}
    refused(api.post("/api/v1/copy_weights", body, headers=long_key), "x-idempotency-key")
    copied = api.post("/api/v1/copy_weights", body, headers={"X-Idempotency-Key": "k" * 128})
    assert copied.status_code == 200, copied.text  # 60 + 60 bytes: within the limit
    over = api.post("/api/v1/copy_weights", body)  # 120 + 60: over it
    assert over.status_code == 400 and "quotas.max_checkpoint_bytes_per_user" in over.json()["error"], over.text
    assert api.run(api.services.quotas.checkpoint_bytes(api.user_id())) == 120
