"""examples/rl_task.py's dense token-set task: targets the base writes at a known rate after every prompt."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import ClassVar

from examples.rl_task import PROMPTS, make_dense_task


class _Tokenizer:
    def encode(self, text: str) -> list[int]:
        return [PROMPTS.index(text)]  # one token per prompt: its index


class _RepeatingSampler:
    """Like the tiny base: a completion repeats one token. After prompt p it is token 100 * p + k with
    probability WEIGHTS[k] (k = 0 its favourite, at 40%), drawn from `seed`."""

    WEIGHTS: ClassVar[list[float]] = [0.4, 0.12, 0.1, 0.08, 0.07, 0.06, 0.05, 0.04, 0.03, 0.03, 0.02]

    def sample(self, prompt, num_samples: int, params) -> SimpleNamespace:
        rng = random.Random(params.seed)
        p = prompt.to_ints()[0]
        tokens = rng.choices([100 * p + k for k in range(len(self.WEIGHTS))], self.WEIGHTS, k=num_samples)
        n = params.max_tokens
        sequences = [SimpleNamespace(tokens=[t] * n, logprobs=[0.0] * n) for t in tokens]
        return SimpleNamespace(result=lambda: SimpleNamespace(sequences=sequences))


def test_every_prompt_starts_near_the_base_reward_without_its_favourite() -> None:
    task = make_dense_task(_Tokenizer(), _RepeatingSampler(), base_reward=0.1)  # type: ignore[arg-type]
    again = make_dense_task(_Tokenizer(), _RepeatingSampler(), base_reward=0.1)  # type: ignore[arg-type]
    assert task.targets == again.targets  # the probe is seeded
    for p in range(len(PROMPTS)):
        mine = {t for t in task.targets if t // 100 == p}
        assert 100 * p not in mine  # the favourite (40%) alone is past 1.5 x base_reward
        # the rate the base writes them at: 0.1 to 0.15 in the probe, give or take its sampling noise
        assert 0.07 <= sum(_RepeatingSampler.WEIGHTS[t % 100] for t in mine) <= 0.18, sorted(mine)
