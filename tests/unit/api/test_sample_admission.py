"""asample's and /v1's admission in process, over a sampler client that holds every admitted sample (none
finishes): each user's fair share of a base model's pending samples (app/api/sample_slots.py), prompt tokens charged
to the token rate, and a published checkpoint's access looked up again at every sample."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from typing import Any

from app.api.backends import SamplerClient
from app.api.sample_slots import SampleSlots
from app.sampling.openai import Answer, Route
from app.sampling.params import SampleArgs
from tests.unit.api.conftest import BASE_MODEL, InProcessApi, new_session, saved_checkpoint


class _HoldingSamplers(SamplerClient):
    """Admits with the real SampleSlots; a sample sent is held (its sampler never answers), its adapter noted."""

    def __init__(self) -> None:
        self.slots = SampleSlots()
        self.sent: list[tuple[str, str | None]] = []  # (user, adapter location)

    def admit(self, base_model: str, user: str, limit: int, share: int) -> bool:
        return self.slots.admit(base_model, user, limit, share)

    def release(self, base_model: str, user: str) -> None:
        self.slots.release(base_model, user)

    def held(self, base_model: str, user: str) -> int:
        return self.slots.held(base_model, user)

    def sample(
        self, base_model: str, request_id: str, adapter_location: str | None, args: SampleArgs, user: str
    ) -> None:
        self.sent.append((user, adapter_location))

    async def openai(
        self, base_model: str, adapter_location: str | None, route: Route, body: dict[str, Any], user: str
    ) -> AsyncGenerator[Answer | str, None]:
        try:  # answered at once: the admission ends with it, as the real client's does
            yield 200, {"object": "text_completion", "choices": []}
        finally:
            self.slots.release(base_model, user)

    async def openai_models(self) -> list[dict[str, Any]]:
        return []

    async def ready(self) -> dict[str, bool]:
        return {BASE_MODEL: True}

    async def start_failures(self) -> dict[str, str]:
        return {}

    def in_flight(self) -> dict[str, int]:
        return {BASE_MODEL: self.slots.held(BASE_MODEL)}


def _holding(make_api: Callable[..., InProcessApi], **overrides: Any) -> tuple[InProcessApi, _HoldingSamplers]:
    api = make_api(**overrides)
    samplers = api.services.samplers = _HoldingSamplers()
    return api, samplers


def _sampler(api: InProcessApi, user: str, model_path: str | None = None) -> str:
    source = {"model_path": model_path} if model_path else {"base_model": BASE_MODEL}
    body = {"session_id": new_session(api, user), "sampling_session_seq_id": 0, **source}
    response = api.post("/api/v1/create_sampling_session", body, user)
    assert response.status_code == 200, response.text
    return str(response.json()["sampling_session_id"])


def _asample(api: InProcessApi, user: str, sampler: str, seq_id: int, prompt_len: int = 3, max_tokens: int = 4) -> Any:
    return api.post(
        "/api/v1/asample",
        {
            "sampling_session_id": sampler,
            "seq_id": seq_id,
            "num_samples": 1,
            "prompt": {"chunks": [{"type": "encoded_text", "tokens": [5] * prompt_len}]},
            "sampling_params": {"max_tokens": max_tokens},
        },
        user,
    )


def test_a_user_past_their_share_is_refused_while_others_still_get_in(make_api: Callable[..., InProcessApi]) -> None:
    api, samplers = _holding(make_api, max_pending_samples=8, max_pending_samples_per_user=2)
    alice, bob, carol = (_sampler(api, user) for user in ("alice", "bob", "carol"))
    answers = [_asample(api, "alice", alice, seq_id) for seq_id in range(1, 9)]
    # past her share of 2, Alice gets in while 2 slots stay free for the others: 6 of the 8
    assert [r.status_code for r in answers] == [200] * 6 + [429] * 2
    refused = answers[-1]
    assert refused.json()["queue_state"] == "paused_capacity"
    assert "quotas.max_pending_samples_per_user=2" in refused.json()["error"]
    assert refused.headers["retry-after"] == "1"
    assert [_asample(api, "bob", bob, seq_id).status_code for seq_id in (1, 2)] == [200, 200]
    full = _asample(api, "carol", carol, 1)  # the pool of 8 is full: under her share, Carol waits for room
    assert full.status_code == 429 and "quotas.max_pending_samples)" in full.json()["error"]
    assert [user for user, _ in samplers.sent].count(api.user_id("alice")) == 6
    assert samplers.slots.held(BASE_MODEL) == 8


def test_a_retried_sample_holds_no_second_slot(make_api: Callable[..., InProcessApi]) -> None:
    api, samplers = _holding(make_api, max_pending_samples=8, max_pending_samples_per_user=2)
    sampler = _sampler(api, "alice")
    first, again = _asample(api, "alice", sampler, 1), _asample(api, "alice", sampler, 1)
    assert first.json()["request_id"] == again.json()["request_id"]
    assert samplers.slots.held(BASE_MODEL, api.user_id("alice")) == 1


def test_prompt_tokens_are_charged_to_the_token_rate(make_api: Callable[..., InProcessApi]) -> None:
    api, _ = _holding(make_api, sample_tokens_per_minute_per_user=100)
    sampler = _sampler(api, "alice")
    assert _asample(api, "alice", sampler, 1, prompt_len=60, max_tokens=4).status_code == 200  # 64 tokens
    # 64 + 64 exceed the 100 a minute; counting max_tokens alone (8) it would pass
    refused = _asample(api, "alice", sampler, 2, prompt_len=60, max_tokens=4)
    assert refused.status_code == 429, refused.text
    assert refused.json()["queue_state"] == "paused_rate_limit"
    assert "quotas.sample_tokens_per_minute_per_user=100" in refused.json()["error"]


def test_a_published_checkpoint_unpublished_stops_serving_other_users(make_api: Callable[..., InProcessApi]) -> None:
    api, samplers = _holding(make_api)
    path = saved_checkpoint(api, "alice", public=True)
    bobs = _sampler(api, "bob", path.uri)
    assert _asample(api, "bob", bobs, 1).status_code == 200
    unpublished = api.client.delete(
        f"/api/v1/training_runs/{path.model_id}/checkpoints/{path.checkpoint_id}/publish", headers=api.headers()
    )
    assert unpublished.status_code == 200, unpublished.text
    refused = _asample(api, "bob", bobs, 2)
    assert refused.status_code == 404, refused.text
    assert refused.json()["error"] == f"model_path {path.uri!r}: no training run {path.model_id!r}"  # as if missing
    assert len(samplers.sent) == 1 and samplers.slots.held(BASE_MODEL) == 1  # nothing more sent nor held
    alices = _sampler(api, "alice", path.uri)  # the owner still samples it
    assert _asample(api, "alice", alices, 1).status_code == 200


def test_a_deleted_checkpoint_stops_serving_its_sampler(make_api: Callable[..., InProcessApi]) -> None:
    api, samplers = _holding(make_api)
    path = saved_checkpoint(api, "alice")
    sampler = _sampler(api, "alice", path.uri)
    deleted = api.client.delete(
        f"/api/v1/training_runs/{path.model_id}/checkpoints/{path.checkpoint_id}", headers=api.headers()
    )
    assert deleted.status_code == 200, deleted.text
    refused = _asample(api, "alice", sampler, 1)
    assert refused.status_code == 404, refused.text
    assert refused.json()["field"] == "model_path" and samplers.sent == []


def _complete(api: InProcessApi, user: str, prompt: str | list[int], max_tokens: int = 4) -> Any:
    return api.post("/v1/completions", {"model": BASE_MODEL, "prompt": prompt, "max_tokens": max_tokens}, user)


def test_v1_shares_the_pool_fairly(make_api: Callable[..., InProcessApi]) -> None:
    api, samplers = _holding(make_api, max_pending_samples=8, max_pending_samples_per_user=2)
    alice = _sampler(api, "alice")
    assert all(_asample(api, "alice", alice, seq_id).status_code == 200 for seq_id in range(1, 7))
    refused = _complete(api, "alice", [5, 6])
    assert refused.status_code == 429 and "quotas.max_pending_samples_per_user=2" in refused.json()["error"]["message"]
    assert _complete(api, "bob", [5, 6]).status_code == 200
    assert samplers.slots.held(BASE_MODEL, api.user_id("bob")) == 0  # given back once answered


def test_v1_charges_prompt_tokens(make_api: Callable[..., InProcessApi]) -> None:
    api, _ = _holding(make_api, sample_tokens_per_minute_per_user=100)
    for prompt in ([5] * 97, "\u00e9" * 49):  # 97 token ids; 49 characters of 2 UTF-8 bytes, at most 98 tokens
        refused = _complete(api, "alice", prompt)
        assert refused.status_code == 400, refused.text
        message = refused.json()["error"]["message"]
        assert "prompt tokens" in message and "quotas.sample_tokens_per_minute_per_user=100" in message
    assert _complete(api, "alice", [5] * 90).status_code == 200
