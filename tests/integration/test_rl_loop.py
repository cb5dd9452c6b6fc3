"""RL through the SDK on the toy task of examples/rl_task.py: the mean reward rises clearly.

importance_sampling with group baselines (no critic), and PPO with a critic and client-side GAE.
"""

from __future__ import annotations

import numpy as np
import tinker
from tinker import types

from examples.rl_task import PPOTrainer, group_advantages, make_task, policy_datum
from tests.integration.conftest import BASE_MODEL

GROUP_SIZE = 8


def test_importance_sampling_raises_reward(service_client: tinker.ServiceClient) -> None:
    policy = service_client.create_lora_training_client(base_model=BASE_MODEL, rank=8, seed=0).result()
    sampler = policy.save_weights_and_get_sampling_client().result()
    task = make_task(policy.get_tokenizer(), sampler)
    rewards = []
    for step in range(8):
        rollouts = task.rollouts(sampler, GROUP_SIZE, seed=step * 1000)
        rewards.append(float(np.mean([r.reward for r in rollouts])))
        data = [policy_datum(r, a) for r, a in zip(rollouts, group_advantages(rollouts, GROUP_SIZE))]
        fb = policy.forward_backward(data, "importance_sampling")
        opt = policy.optim_step(types.AdamParams(learning_rate=1e-2))
        fb.result(), opt.result()
        sampler = policy.save_weights_and_get_sampling_client().result()
    print("importance_sampling mean rewards:", [round(r, 3) for r in rewards])
    assert rewards[0] < 0.2  # the targets are rare at first
    assert np.mean(rewards[-3:]) > rewards[0] + 0.4, rewards


def test_ppo_with_critic_raises_reward(service_client: tinker.ServiceClient) -> None:
    policy = service_client.create_lora_training_client(base_model=BASE_MODEL, rank=8, seed=0).result()
    critic = service_client.create_lora_training_client(
        base_model=BASE_MODEL, rank=8, seed=0, user_metadata={"model_role": "critic"}
    ).result()
    sampler = policy.save_weights_and_get_sampling_client().result()
    ppo = PPOTrainer(policy, critic, make_task(policy.get_tokenizer(), sampler), group_size=GROUP_SIZE, sampler=sampler)
    metrics = [ppo.iteration(seed=i * 1000) for i in range(12)]
    rewards = [m["reward"] for m in metrics]
    print(
        "ppo mean rewards:",
        [round(r, 3) for r in rewards],
        "value errors:",
        [round(m["value_error"], 3) for m in metrics],
    )
    assert all(np.isfinite([m["policy_loss"], m["critic_loss"], m["value_error"]]).all() for m in metrics)
    assert set(ppo.phase_seconds) == {"sample", "critic_values", "policy_step", "critic_step", "weight_sync"}
    assert np.mean(rewards[-3:]) > rewards[0] + 0.3, rewards
