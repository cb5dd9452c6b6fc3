"""A toy RL task for the embedded model, and the client-side pieces of an RL loop over the Tinker SDK.

The task: after each prompt, write only tokens from a target set; the reward of a completion is the
fraction of its tokens in the set. The set holds tokens the untrained model writes now and then (make_task), or
in about a tenth of its tokens after every prompt (make_dense_task: every group has a signal from the first step),
so the reward starts low but above zero and learning shows quickly.

Used by examples/ppo.py, examples/cookbook_env.py, bench/ppo_iteration.py and the RL integration tests.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import tinker
from tinker import types

PROMPTS = ["What is 2 + 2?", "Name a colour:", "The cat sat on the", "Count to three:"]
PROBE_GROUP = 64  # completions of a prompt per probe request: the sampler's default limits.max_num_samples


@dataclass(frozen=True)
class Rollout:
    """One sampled completion of a prompt, with the sampler's logprobs and its reward."""

    prompt: list[int]
    tokens: list[int]
    logprobs: list[float]
    reward: float


@dataclass(frozen=True)
class TokenSetTask:
    prompts: list[list[int]]
    targets: frozenset[int]
    completion_tokens: int

    def reward(self, tokens: list[int]) -> float:
        return sum(t in self.targets for t in tokens) / self.completion_tokens

    def sampling_params(self, seed: int | None = None) -> types.SamplingParams:
        """Fixed-length completions at temperature 1 (`stop=[]`: no early end at EOS)."""
        return types.SamplingParams(max_tokens=self.completion_tokens, temperature=1.0, stop=[], seed=seed)

    def rollouts(self, sampler: tinker.SamplingClient, group_size: int, seed: int) -> list[Rollout]:
        """`group_size` completions of every prompt, all requested at once."""
        futures = [
            sampler.sample(types.ModelInput.from_ints(p), group_size, self.sampling_params(seed + i))
            for i, p in enumerate(self.prompts)
        ]
        return [
            Rollout(prompt, seq.tokens, seq.logprobs, self.reward(seq.tokens))
            for prompt, future in zip(self.prompts, futures)
            for seq in future.result().sequences
        ]


def probe_rollouts(
    tokenizer, sampler: tinker.SamplingClient, group_size: int, completion_tokens: int, seed: int, rounds: int = 1
) -> list[Rollout]:
    """`rounds` x `group_size` seeded completions of every prompt in PROMPTS, unrewarded: what the base writes."""
    probe = TokenSetTask([tokenizer.encode(p) for p in PROMPTS], frozenset(), completion_tokens)
    return [r for k in range(rounds) for r in probe.rollouts(sampler, group_size, seed + k * len(PROMPTS))]


def make_task(
    tokenizer,
    sampler: tinker.SamplingClient,
    num_targets: int = 16,
    completion_tokens: int = 8,
    skip_most_common: int = 16,
    seed: int = 10**6,
) -> TokenSetTask:
    """A task whose targets are tokens `sampler` writes after PROMPTS, but not its favourites: the
    `num_targets` next most frequent after the `skip_most_common` most frequent."""
    rollouts = probe_rollouts(tokenizer, sampler, 16, completion_tokens, seed)
    counts = Counter(t for r in rollouts for t in r.tokens)
    ranked = [t for t, _ in counts.most_common(skip_most_common + num_targets)]
    return TokenSetTask([tokenizer.encode(p) for p in PROMPTS], frozenset(ranked[skip_most_common:]), completion_tokens)


def make_dense_task(
    tokenizer,
    sampler: tinker.SamplingClient,
    base_reward: float = 0.1,
    completion_tokens: int = 8,
    probe_rounds: int = 2,
    seed: int = 10**6,
) -> TokenSetTask:
    """A task on which `sampler` scores about `base_reward` after every prompt, so that from the first step most
    groups of a few completions hold rewarded and unrewarded ones. Per prompt, in a seeded probe of `probe_rounds` x
    PROBE_GROUP completions, its most frequent tokens are added until they make `base_reward` of what it wrote,
    skipping any that alone would take it past 1.5 x `base_reward` (a favourite). make_task's 16 rarer tokens from
    a 16-completion probe are mostly ones a single completion repeated: the base writes them in ~2% of its tokens,
    not the ~18% the probe counts."""
    by_prompt: dict[tuple[int, ...], Counter[int]] = {}
    for r in probe_rollouts(tokenizer, sampler, PROBE_GROUP, completion_tokens, seed, probe_rounds):
        by_prompt.setdefault(tuple(r.prompt), Counter()).update(r.tokens)
    targets: set[int] = set()
    written = probe_rounds * PROBE_GROUP * completion_tokens
    for counts in by_prompt.values():
        share = sum(counts[t] for t in targets) / written
        for token, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
            if share >= base_reward:
                break
            if token not in targets and share + n / written <= 1.5 * base_reward:
                targets.add(token)
                share += n / written
    return TokenSetTask([tokenizer.encode(p) for p in PROMPTS], frozenset(targets), completion_tokens)


def group_advantages(rollouts: list[Rollout], group_size: int) -> list[float]:
    """Each reward minus its prompt group's mean (GRPO-style; no critic needed)."""
    rewards = np.array([r.reward for r in rollouts]).reshape(-1, group_size)
    return (rewards - rewards.mean(axis=1, keepdims=True)).reshape(-1).tolist()


def sequence_input(rollout: Rollout) -> types.ModelInput:
    """Prompt and completion, minus the last token: position t predicts token t + 1."""
    return types.ModelInput.from_ints((rollout.prompt + rollout.tokens)[:-1])


def policy_datum(rollout: Rollout, token_advantages: list[float] | float) -> types.Datum:
    """An importance_sampling / ppo datum: completion targets carry the sampler's logprobs and advantages;
    prompt targets carry zeros, so they add nothing to the loss."""
    n_prompt, n = len(rollout.prompt) - 1, len(rollout.tokens)
    advantages = [token_advantages] * n if isinstance(token_advantages, float) else list(token_advantages)
    return types.Datum(
        model_input=sequence_input(rollout),
        loss_fn_inputs={
            "target_tokens": (rollout.prompt + rollout.tokens)[1:],
            "logprobs": [0.0] * n_prompt + list(rollout.logprobs),
            "advantages": [0.0] * n_prompt + advantages,
        },
    )


def completion_values(rollout: Rollout, values: np.ndarray) -> np.ndarray:
    """The critic's values of the states in which the completion's tokens were chosen."""
    start = len(rollout.prompt) - 1
    return values[start : start + len(rollout.tokens)]


def gae(reward: float, values: np.ndarray, gamma: float = 1.0, lam: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Generalised advantage estimation for one completion whose only reward comes at its end.
    Returns (advantages, returns) per completion token; returns = advantages + values."""
    n = len(values)
    advantages = np.zeros(n)
    running = 0.0
    for t in reversed(range(n)):
        next_value = values[t + 1] if t + 1 < n else 0.0
        delta = (reward if t == n - 1 else 0.0) + gamma * next_value - values[t]
        running = delta + gamma * lam * running
        advantages[t] = running
    return advantages, advantages + values


def critic_datum(rollout: Rollout, old_values: np.ndarray, returns: np.ndarray) -> types.Datum:
    """A value-loss datum: only the completion's states are weighted."""
    n_prompt, n = len(rollout.prompt) - 1, len(rollout.tokens)
    full_old = np.zeros(n_prompt + n, np.float32)
    full_returns = np.zeros(n_prompt + n, np.float32)
    full_old[n_prompt:], full_returns[n_prompt:] = old_values, returns
    return types.Datum(
        model_input=sequence_input(rollout),
        loss_fn_inputs={
            "values": full_old,
            "returns": full_returns,
            "weights": np.r_[np.zeros(n_prompt), np.ones(n)].astype(np.float32),
        },
    )


@dataclass
class PPOTrainer:
    """PPO with a learned critic: sample, value the states, GAE on the client, then one step for each model."""

    policy: tinker.TrainingClient
    critic: tinker.TrainingClient
    task: TokenSetTask
    group_size: int = 8
    policy_lr: float = 1e-2
    critic_lr: float = 1e-3  # 3e-3 overshoots early and its noisy values drown the advantages
    sampler: tinker.SamplingClient | None = None
    phase_seconds: dict[str, float] = field(default_factory=dict)  # of the last iteration

    def iteration(self, seed: int) -> dict[str, float]:
        """One PPO iteration; returns its metrics (mean reward, mean squared value error, losses)."""
        phases: dict[str, float] = {}
        started = time.perf_counter()

        def lap(name: str) -> None:
            nonlocal started
            now = time.perf_counter()
            phases[name] = now - started
            started = now

        if self.sampler is None:
            self.sampler = self.policy.save_weights_and_get_sampling_client().result()
            lap("weight_sync")
        rollouts = self.task.rollouts(self.sampler, self.group_size, seed)
        lap("sample")
        bare = [types.Datum(model_input=sequence_input(r), loss_fn_inputs={}) for r in rollouts]
        forward = self.critic.forward(bare, "ppo").result()
        values = [
            completion_values(r, np.asarray(out["values"].to_numpy()))
            for r, out in zip(rollouts, forward.loss_fn_outputs)
        ]
        estimates = [gae(r.reward, v) for r, v in zip(rollouts, values)]
        lap("critic_values")
        # Raw GAE advantages: normalising them amplifies noise while nearly every reward is still 0.
        policy_fb = self.policy.forward_backward(
            [policy_datum(r, a.tolist()) for r, (a, _) in zip(rollouts, estimates)], "ppo"
        )
        policy_opt = self.policy.optim_step(types.AdamParams(learning_rate=self.policy_lr))
        policy_loss = policy_fb.result().metrics["loss:sum"]
        policy_opt.result()
        lap("policy_step")
        critic_fb = self.critic.forward_backward(
            [critic_datum(r, v, ret) for r, v, (_, ret) in zip(rollouts, values, estimates)], "ppo"
        )
        critic_opt = self.critic.optim_step(types.AdamParams(learning_rate=self.critic_lr))
        critic_loss = critic_fb.result().metrics["loss:sum"]
        critic_opt.result()
        lap("critic_step")
        self.sampler = self.policy.save_weights_and_get_sampling_client().result()
        lap("weight_sync")
        self.phase_seconds = phases
        value_error = np.mean(np.concatenate([(v - ret) ** 2 for v, (_, ret) in zip(values, estimates)]))
        return {
            "reward": float(np.mean([r.reward for r in rollouts])),
            "value_error": float(value_error),
            "policy_loss": policy_loss,
            "critic_loss": critic_loss,
        }
