"""Critic models through the SDK: values, the value loss, independence from policies, routing, refusals."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import httpx
import numpy as np
import pytest
import tinker
from tinker import types

from tests.integration.conftest import BASE_MODEL
from tests.integration.helpers import critic_datums, logprobs_of, new_client, parity_returns, sft_datums, values_of

CRITIC_METADATA = {"model_role": "critic"}


@pytest.fixture(scope="module")
def pair(service_client: tinker.ServiceClient) -> tuple[tinker.TrainingClient, tinker.TrainingClient]:
    """A policy and a critic created in the same session."""
    policy = new_client(service_client, seed=41)
    critic = service_client.create_lora_training_client(
        base_model=BASE_MODEL, rank=8, seed=41, user_metadata=CRITIC_METADATA
    ).result()
    return policy, critic


def test_critic_learns_values_and_policy_is_independent(pair, state_dir: Path) -> None:
    policy, critic = pair
    tokenizer = policy.get_tokenizer()
    bare = critic_datums(tokenizer)
    fresh = values_of(critic.forward(bare, "ppo").result())
    assert [len(v) for v in fresh] == [d.model_input.length for d in bare]
    assert all(np.all(v == 0) for v in fresh)  # the value head starts at zero

    probe = sft_datums(tokenizer, 2)
    policy_before = logprobs_of(policy.forward(probe, "cross_entropy").result())
    returns = [parity_returns(np.asarray(d.model_input.to_ints())) for d in bare]
    errors = []
    old = fresh
    for _ in range(12):
        errors.append(float(np.mean(np.concatenate([(v - r) ** 2 for v, r in zip(old, returns)]))))
        result = critic.forward_backward(critic_datums(tokenizer, old), "ppo").result()
        assert "loss:sum" in result.metrics
        assert set(result.loss_fn_outputs[0]) == {"values", "elementwise_loss"}
        critic.optim_step(types.AdamParams(learning_rate=3e-3)).result()
        old = values_of(critic.forward(bare, "ppo").result())
    final = float(np.mean(np.concatenate([(v - r) ** 2 for v, r in zip(old, returns)])))
    assert errors[0] == pytest.approx(1.0)
    assert final < 0.25 * errors[0], errors  # sharply, in a dozen steps

    # The critic's steps left the policy alone; a policy step leaves the critic alone.
    for before, after in zip(policy_before, logprobs_of(policy.forward(probe, "cross_entropy").result())):
        np.testing.assert_array_equal(after, before)
    policy.forward_backward(probe, "cross_entropy").result()
    policy.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    for before, after in zip(old, values_of(critic.forward(bare, "ppo").result())):
        np.testing.assert_array_equal(after, before)

    # The routing table: each model on the trainer of its role (critics have their own worker group here).
    with sqlite3.connect(state_dir / "tinker_serve.db") as db:
        routes = {
            m: (role, trainer)
            for m, role, trainer in db.execute(
                "SELECT model_id, role, trainer FROM training_runs WHERE model_id IN (?, ?)",
                (policy.model_id, critic.model_id),
            )
        }
    assert routes == {policy.model_id: ("policy", BASE_MODEL), critic.model_id: ("critic", f"{BASE_MODEL}:critic")}


def test_critic_value_loss_through_the_sdk_matches_its_formula(pair) -> None:
    _, critic = pair
    tokenizer = critic.get_tokenizer()
    current = values_of(critic.forward(critic_datums(tokenizer), "ppo").result())
    rng = np.random.default_rng(0)
    old = [v + rng.uniform(-0.5, 0.5, v.shape).astype(np.float32) for v in current]
    datums = critic_datums(tokenizer, old)
    result = critic.forward(datums, "ppo", {"value_clip": 0.1}).result()
    expected = 0.0
    for v, o, d in zip(values_of(result), old, datums):
        r = np.asarray(d.loss_fn_inputs["returns"].data, np.float64)
        clipped = o + np.clip(v - o, -0.1, 0.1)
        expected += 0.5 * np.maximum((v - r) ** 2, (clipped - r) ** 2).sum()
    assert result.metrics["loss:sum"] == pytest.approx(expected, rel=1e-4)


def test_sampling_a_critic_fails(pair, service_client: tinker.ServiceClient) -> None:
    _, critic = pair
    for save in (critic.save_weights_and_get_sampling_client, lambda: critic.save_weights_for_sampler("never")):
        with pytest.raises(tinker.RequestFailedError, match="is a critic") as info:  # a sequenced op's future fails
            save().result()
        assert info.value.category is types.RequestErrorCategory.User
    with pytest.raises(tinker.BadRequestError, match="critic"):  # its training checkpoint holds an adapter, too
        service_client.create_sampling_client(model_path=critic.save_state("not-for-sampling").result().path).result()


def test_wrong_losses_and_roles_are_user_errors(pair, service_client: tinker.ServiceClient) -> None:
    policy, critic = pair
    tokenizer = policy.get_tokenizer()
    for datums, loss_fn, field in (
        (sft_datums(tokenizer, 1), "cross_entropy", "loss_fn"),
        (critic_datums(tokenizer), "ppo", "returns"),
    ):
        with pytest.raises(tinker.RequestFailedError, match=field) as info:
            critic.forward_backward(datums, loss_fn).result()
        assert info.value.category is types.RequestErrorCategory.User
    with pytest.raises(tinker.BadRequestError, match="model_role"):
        service_client.create_lora_training_client(
            base_model=BASE_MODEL, rank=4, user_metadata={"model_role": "judge"}
        ).result()


def test_model_role_field(base_url: str, state_dir: Path) -> None:
    """SkyRL's clients send `model_role` in the create_model body."""
    with httpx.Client(base_url=base_url, timeout=30, headers={"X-API-Key": "tml-integration-tests"}) as http:
        session = http.post("/api/v1/create_session", json={}).json()["session_id"]
        body = {"session_id": session, "model_seq_id": 0, "base_model": BASE_MODEL, "lora_config": {"rank": 4}}
        for bad, field in (
            ({"model_role": "judge"}, "model_role"),
            ({"model_role": "critic", "user_metadata": {"model_role": "policy"}}, "model_role"),
        ):
            answer = http.post("/api/v1/create_model", json={**body, **bad})
            assert answer.status_code == 400 and field in answer.text
        created = http.post("/api/v1/create_model", json={**body, "model_role": "critic"}).json()
        done = http.post("/api/v1/retrieve_future", json={"request_id": created["request_id"]}).json()
        assert done["model_id"] == created["model_id"]
    with sqlite3.connect(state_dir / "tinker_serve.db") as db:
        row = db.execute(
            "SELECT role, trainer FROM training_runs WHERE model_id = ?", (created["model_id"],)
        ).fetchone()
    assert row == ("critic", f"{BASE_MODEL}:critic")
