"""examples/rl_task.py's token-set task as a tinker-cookbook RL environment, so the cookbook's own loops
(`tinker_cookbook.rl.train`) train on it against this server: one completion per episode, rewarded by the
fraction of its tokens in the target set.

Used by tests/integration/test_cookbook.py and bench/off_policy_losses.py.
"""

from __future__ import annotations

from collections.abc import Sequence

import chz
import tinker
from tinker_cookbook.rl.types import Env, EnvGroupBuilder, RLDataset, RLDatasetBuilder, StepResult
from tinker_cookbook.tokenizer_utils import get_tokenizer

from examples.rl_task import PROMPTS, make_dense_task


class TokenSetEnv(Env):
    """One completion of a prompt; the reward is the fraction of its `completion_tokens` in the target set."""

    def __init__(self, prompt: list[int], targets: frozenset[int], completion_tokens: int) -> None:
        self.prompt, self.targets, self.completion_tokens = prompt, targets, completion_tokens

    async def initial_observation(self) -> tuple[tinker.ModelInput, list[int]]:
        return tinker.ModelInput.from_ints(self.prompt), []

    async def step(self, action: list[int], *, extra: dict | None = None) -> StepResult:
        reward = sum(t in self.targets for t in action) / self.completion_tokens
        return StepResult(
            reward=reward, episode_done=True, next_observation=tinker.ModelInput.from_ints([]), next_stop_condition=[]
        )


class TokenSetGroup(EnvGroupBuilder):
    def __init__(self, prompt: list[int], targets: frozenset[int], completion_tokens: int, group_size: int) -> None:
        self.prompt, self.targets, self.completion_tokens, self.group_size = (
            prompt,
            targets,
            completion_tokens,
            group_size,
        )

    async def make_envs(self) -> Sequence[Env]:
        return [TokenSetEnv(self.prompt, self.targets, self.completion_tokens) for _ in range(self.group_size)]


class TokenSetDataset(RLDataset):
    """The same prompts in every batch."""

    def __init__(self, groups: list[TokenSetGroup], batches: int) -> None:
        self.groups, self.batches = groups, batches

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        return self.groups

    def __len__(self) -> int:
        return self.batches


@chz.chz
class TokenSetDatasetBuilder(RLDatasetBuilder):
    model_name: str
    targets: tuple[int, ...]
    batches: int
    completion_tokens: int = 8
    group_size: int = 8

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        tokenizer = get_tokenizer(self.model_name)  # by name, offline: the server registered it
        groups = [
            TokenSetGroup(tokenizer.encode(p), frozenset(self.targets), self.completion_tokens, self.group_size)
            for p in PROMPTS
        ]
        return TokenSetDataset(groups, self.batches), None


def token_set_targets(service: tinker.ServiceClient, model_name: str, completion_tokens: int = 8) -> tuple[int, ...]:
    """The task's target tokens for this base model (examples/rl_task.py's make_dense_task: ones it writes in about
    a tenth of its tokens after every prompt)."""
    sampler = service.create_sampling_client(base_model=model_name).result()
    task = make_dense_task(get_tokenizer(model_name), sampler, completion_tokens=completion_tokens)
    return tuple(sorted(task.targets))
