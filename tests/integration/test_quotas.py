"""Per-user quotas on the real app: the shared app gives the users of QUOTA_KEYS tight quotas of their own
(`quotas.users`, conftest's server_config). Each limit refuses cleanly (sizes: a user error naming it; rates and
queues: 429 with Retry-After) and nothing accepted is lost; other users, the suite's included, are not held back."""

from __future__ import annotations

import httpx
import tinker

from tests.integration.conftest import BASE_MODEL
from tests.integration.helpers import future_result, raw_client


def _model(http: httpx.Client, session: str, seq: int) -> httpx.Response:
    body = {"session_id": session, "model_seq_id": seq, "base_model": BASE_MODEL, "lora_config": {"rank": 4}}
    return http.post("/api/v1/create_model", json=body)


def test_live_models_and_checkpoint_bytes(base_url: str) -> None:
    with raw_client(base_url, "tml-quota-sizes") as http:
        session = http.post("/api/v1/create_session", json={}).json()["session_id"]
        models = [future_result(http, _model(http, session, i).json()["request_id"])["model_id"] for i in range(2)]
        third = _model(http, session, 2)
        assert third.status_code == 400 and "quotas.max_live_models_per_user" in third.json()["error"]
        assert third.json()["field"] == "model_seq_id"
        with raw_client(base_url, "tml-quota-other") as other:  # another user is not held back
            other_session = other.post("/api/v1/create_session", json={}).json()["session_id"]
            assert _model(other, other_session, 0).status_code == 200
        future_result(http, http.post("/api/v1/unload_model", json={"model_id": models[0]}).json()["request_id"])
        assert _model(http, session, 2).status_code == 200  # room again

        def save(seq: int, name: str) -> dict:
            saved = http.post("/api/v1/save_weights", json={"model_id": models[1], "seq_id": seq, "path": name})
            return future_result(http, saved.json()["request_id"])

        first = save(1, "first")["path"]
        refused = save(2, "second")
        assert refused["category"] == "user" and "quotas.max_checkpoint_bytes_per_user" in refused["error"]
        listed = http.get(f"/api/v1/training_runs/{models[1]}/checkpoints").json()["checkpoints"]
        assert [c["tinker_path"] for c in listed] == [first]  # the accepted one is kept
        assert http.delete(f"/api/v1/training_runs/{models[1]}/checkpoints/weights/first").status_code == 200
        assert "path" in save(3, "second")  # the model's order went on past the refusal


def test_pending_operations_and_sampled_tokens(base_url: str) -> None:
    with raw_client(base_url, "tml-quota-rates") as http:
        session = http.post("/api/v1/create_session", json={}).json()["session_id"]
        model = future_result(http, _model(http, session, 0).json()["request_id"])["model_id"]
        adam = {"learning_rate": 1e-3}

        def step(seq: int) -> httpx.Response:
            return http.post("/api/v1/optim_step", json={"model_id": model, "seq_id": seq, "adam_params": adam})

        queued = [step(seq).json()["request_id"] for seq in (2, 3, 4)]  # all wait behind seq 1, not sent yet
        fourth = step(5)
        assert fourth.status_code == 429 and int(fourth.headers["retry-after"]) >= 1
        first = step(1)  # what the pending ones wait for is admitted past the limit
        assert first.status_code == 200
        assert all("error" not in future_result(http, r) for r in [first.json()["request_id"], *queued])  # none lost
        assert step(5).status_code == 200  # room again

        sampler = http.post(
            "/api/v1/create_sampling_session",
            json={"session_id": session, "sampling_session_seq_id": 0, "base_model": BASE_MODEL},
        ).json()["sampling_session_id"]

        def sample(seq: int) -> httpx.Response:
            prompt = {"chunks": [{"type": "encoded_text", "tokens": [20, 21, 22]}]}
            body = {"sampling_session_id": sampler, "seq_id": seq, "num_samples": 2, "prompt": prompt}
            return http.post("/api/v1/asample", json={**body, "sampling_params": {"max_tokens": 16}})

        assert sample(1).status_code == 200  # 2 x 16 = 32 of the 40 tokens a minute
        limited = sample(2)
        assert limited.status_code == 429 and "sample_tokens_per_minute_per_user" in limited.json()["error"]
        assert int(limited.headers["retry-after"]) >= 1


def test_the_sdk_waits_out_a_full_queue(base_url: str) -> None:
    """Through the SDK, the 429s of a full queue are waited out: every step of a pipelined run completes."""
    service = tinker.ServiceClient(base_url=base_url, api_key="tml-quota-sdk")
    try:
        training = service.create_lora_training_client(base_model=BASE_MODEL, rank=4).result()
        steps = [training.optim_step(tinker.AdamParams(learning_rate=1e-3)) for _ in range(8)]
        assert len([s.result() for s in steps]) == 8
    finally:
        service.close("success").result()
