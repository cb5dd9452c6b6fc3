"""tinker-cookbook's own RL loop, unmodified, against this server: the async loop (AsyncConfig) with its default
loss, stable_reinforce, learns a synthetic token-set task; the tokenizer resolves by model name offline."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path

import chz
import numpy as np
import pytest
import tinker
from tinker_cookbook.rl import train
from tinker_cookbook.rl.types import Env, EnvGroupBuilder, RLDataset, RLDatasetBuilder, StepResult
from tinker_cookbook.tokenizer_utils import get_tokenizer
from tinker_cookbook.utils import cost_estimation

from examples.rl_task import PROMPTS
from tests.integration.conftest import BASE_MODEL

COMPLETION_TOKENS = 8
GROUP_SIZE = 8


class TokenSetEnv(Env):
    """One completion of a prompt; the reward is the fraction of its tokens in the target set."""

    def __init__(self, prompt: list[int], targets: frozenset[int]) -> None:
        self.prompt, self.targets = prompt, targets

    async def initial_observation(self) -> tuple[tinker.ModelInput, list[int]]:
        return tinker.ModelInput.from_ints(self.prompt), []

    async def step(self, action: list[int], *, extra: dict | None = None) -> StepResult:
        reward = sum(t in self.targets for t in action) / COMPLETION_TOKENS
        return StepResult(
            reward=reward, episode_done=True, next_observation=tinker.ModelInput.from_ints([]), next_stop_condition=[]
        )


class TokenSetGroup(EnvGroupBuilder):
    def __init__(self, prompt: list[int], targets: frozenset[int]) -> None:
        self.prompt, self.targets = prompt, targets

    async def make_envs(self) -> Sequence[Env]:
        return [TokenSetEnv(self.prompt, self.targets) for _ in range(GROUP_SIZE)]


class TokenSetDataset(RLDataset):
    def __init__(self, prompts: list[list[int]], targets: frozenset[int], batches: int) -> None:
        self.prompts, self.targets, self.batches = prompts, targets, batches

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        return [TokenSetGroup(p, self.targets) for p in self.prompts]

    def __len__(self) -> int:
        return self.batches


@chz.chz
class TokenSetDatasetBuilder(RLDatasetBuilder):
    targets: tuple[int, ...]
    batches: int

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        tokenizer = get_tokenizer(BASE_MODEL)  # by name, offline: the server registered it
        return TokenSetDataset([tokenizer.encode(p) for p in PROMPTS], frozenset(self.targets), self.batches), None


def _targets(service_client: tinker.ServiceClient) -> tuple[int, ...]:
    from examples.rl_task import make_task

    sampler = service_client.create_sampling_client(base_model=BASE_MODEL).result()
    return tuple(sorted(make_task(get_tokenizer(BASE_MODEL), sampler, completion_tokens=COMPLETION_TOKENS).targets))


def _rewards(log_path: Path) -> list[float]:
    rows = [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [row["env/all/reward/total"] for row in rows if "env/all/reward/total" in row]


def test_async_rl_loop_with_its_default_loss_learns(
    service_client, base_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TINKER_API_KEY", "tml-cookbook")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # The loop would fetch a price list from the internet once (and log token counts only when that fails):
    # tests reach loopback only, so mark it fetched and absent.
    monkeypatch.setattr(cost_estimation, "_pricing_fetched", True)
    config = train.Config(
        learning_rate=5e-3,
        dataset_builder=TokenSetDatasetBuilder(targets=_targets(service_client), batches=10),
        model_name=BASE_MODEL,
        recipe_name="tinker-serve-token-set",
        renderer_name="role_colon",
        max_tokens=COMPLETION_TOKENS,
        lora_rank=8,
        log_path=str(tmp_path / "async"),
        base_url=base_url,
        eval_every=0,
        save_every=0,
        async_config=train.AsyncConfig(max_steps_off_policy=2, groups_per_batch=len(PROMPTS)),
    )
    assert config.training_loss_fn() == "stable_reinforce"
    asyncio.run(train.main(config))
    rewards = _rewards(tmp_path / "async")
    print("cookbook async stable_reinforce rewards:", [round(r, 3) for r in rewards])
    assert len(rewards) == 10 and rewards[0] < 0.2
    assert np.mean(rewards[-3:]) > rewards[0] + 0.3, rewards
