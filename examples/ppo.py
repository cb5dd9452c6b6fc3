"""PPO with a critic on the embedded tiny model through a running `make serve`: the policy learns to
write tokens from a target set (see rl_task.py), the critic learns to predict the reward, and
advantages come from GAE on the client.

    .venv/bin/python examples/ppo.py [--base-url http://127.0.0.1:8000] [--iterations 15]
"""

from __future__ import annotations

import argparse
import time

import tinker
from rl_task import PPOTrainer, make_task

BASE_MODEL = "tinker-serve/tiny"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--iterations", type=int, default=15)
    parser.add_argument("--group-size", type=int, default=8)
    args = parser.parse_args()
    service = tinker.ServiceClient(base_url=args.base_url, api_key="tml-example")
    policy = service.create_lora_training_client(base_model=BASE_MODEL, rank=8, seed=0).result()
    critic = service.create_lora_training_client(
        base_model=BASE_MODEL, rank=8, seed=0, user_metadata={"model_role": "critic"}
    ).result()
    sampler = policy.save_weights_and_get_sampling_client().result()
    task = make_task(policy.get_tokenizer(), sampler)
    ppo = PPOTrainer(policy, critic, task, group_size=args.group_size, sampler=sampler)
    print(
        f"policy {policy.model_id}, critic {critic.model_id}; {len(task.prompts)} prompts x {args.group_size} "
        f"samples x {task.completion_tokens} tokens per iteration"
    )
    for i in range(args.iterations):
        started = time.perf_counter()
        m = ppo.iteration(seed=i * 1000)
        phases = "  ".join(f"{k} {v:.2f}s" for k, v in ppo.phase_seconds.items())
        print(
            f"iter {i:3d}  reward {m['reward']:.3f}  value error {m['value_error']:.3f}  "
            f"({time.perf_counter() - started:.1f} s: {phases})",
            flush=True,
        )
    service.close("success").result()


if __name__ == "__main__":
    main()
