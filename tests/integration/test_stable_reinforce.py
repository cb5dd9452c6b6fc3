"""stable_reinforce through the SDK, built as the cookbook builds it (Datum.with_provenance naming each sampled
sequence): on the toy task of examples/rl_task.py the reward rises while every other update trains on samples
one step stale; fresh samples give ratios of 1 (the sampler's recorded logprobs equal the trainer's); another
session's sequences are unknown here."""

from __future__ import annotations

import numpy as np
import pytest
import tinker
from tinker import types

from examples.rl_task import Rollout, group_advantages, make_task, policy_datum
from tests.integration.conftest import BASE_MODEL

GROUP_SIZE = 8


def _rollouts(task, sampler: tinker.SamplingClient, seed: int) -> list[tuple[Rollout, str]]:
    futures = [
        sampler.sample(types.ModelInput.from_ints(p), GROUP_SIZE, task.sampling_params(seed + i))
        for i, p in enumerate(task.prompts)
    ]
    return [
        (Rollout(prompt, s.tokens, s.logprobs, task.reward(s.tokens)), s.sequence_id)
        for prompt, future in zip(task.prompts, futures)
        for s in future.result().sequences
    ]


def _datum(rollout: Rollout, advantage: float, sequence_id: str) -> types.Datum:
    prompt, n = len(rollout.prompt), len(rollout.tokens)
    return policy_datum(rollout, advantage).with_provenance(
        model_input=[
            types.PromptProvenanceSpan(sequence_id=sequence_id, length=prompt),
            types.SampledProvenanceSpan(sequence_id=sequence_id, length=n - 1),
        ],
        loss_fn_inputs=[
            types.PromptProvenanceSpan(sequence_id=sequence_id, offset=1, length=prompt - 1),
            types.SampledProvenanceSpan(sequence_id=sequence_id, length=n),
        ],
    )


def _data(batch: list[tuple[Rollout, str]]) -> list[types.Datum]:
    advantages = group_advantages([r for r, _ in batch], GROUP_SIZE)
    return [_datum(r, a, sid) for (r, sid), a in zip(batch, advantages)]


@pytest.fixture
def session(base_url: str) -> tinker.ServiceClient:
    """A session per test: each stays under quotas.max_stability_records_per_session."""
    client = tinker.ServiceClient(base_url=base_url, api_key="tml-stable-reinforce")
    yield client
    client.close("success").result()


def test_stable_reinforce_learns_on_stale_samples(session: tinker.ServiceClient) -> None:
    policy = session.create_lora_training_client(base_model=BASE_MODEL, rank=8, seed=0).result()
    sampler = policy.save_weights_and_get_sampling_client(record_stability_info=True).result()
    task = make_task(policy.get_tokenizer(), sampler)
    rewards, metrics = [], []
    for step in range(10):
        if step % 2 == 0:  # fresh samples every other step: the odd steps train on data one update old
            batch = _rollouts(task, sampler, seed=step * 1000)
            rewards.append(float(np.mean([r.reward for r, _ in batch])))
        fb = policy.forward_backward(_data(batch), "stable_reinforce", loss_fn_config={"kl_coeff": 0.01})
        opt = policy.optim_step(types.AdamParams(learning_rate=1e-2))
        metrics.append(fb.result().metrics)
        opt.result()
        if step % 2 == 1:
            sampler = policy.save_weights_and_get_sampling_client(record_stability_info=True).result()
    print(
        "stable_reinforce mean rewards:",
        [round(r, 3) for r in rewards],
        "ratio:",
        [round(m["stable_reinforce/ratio:mean"], 3) for m in metrics],
    )
    fresh = metrics[0]
    assert fresh["stable_reinforce/ratio:mean"] == pytest.approx(1.0, abs=0.02)  # sampler and trainer agree
    assert fresh["stable_reinforce/masked_fraction:mean"] == 0.0
    assert fresh["stable_reinforce/kl:mean"] == pytest.approx(0.0, abs=1e-3)
    assert any(abs(m["stable_reinforce/ratio:mean"] - 1) > 0.01 for m in metrics[1::2])  # stale steps are off-policy
    assert rewards[0] < 0.2
    assert np.mean(rewards[-2:]) > rewards[0] + 0.3, rewards


def test_another_sessions_sequences_are_unknown(session: tinker.ServiceClient, base_url: str) -> None:
    policy = session.create_lora_training_client(base_model=BASE_MODEL, rank=8, seed=1).result()
    sampler = policy.save_weights_and_get_sampling_client(record_stability_info=True).result()
    batch = _rollouts(make_task(policy.get_tokenizer(), sampler), sampler, seed=5)[:GROUP_SIZE]
    other = tinker.ServiceClient(base_url=base_url, api_key="tml-another-session")
    try:
        stranger = other.create_lora_training_client(base_model=BASE_MODEL, rank=8, seed=1).result()
        with pytest.raises(tinker.RequestFailedError, match="no stability record"):
            stranger.forward_backward(_data(batch), "stable_reinforce").result()
    finally:
        other.close("success").result()
    owner = policy.forward_backward(_data(batch), "stable_reinforce").result().metrics  # the session that sampled
    assert owner["stable_reinforce/ratio:mean"] == pytest.approx(1.0, abs=0.02)
