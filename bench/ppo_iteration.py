"""PPO-iteration benchmark: one iteration of examples/rl_task.py's PPOTrainer (sample, value the states,
policy step, critic step, weight sync) through the SDK and the Serve app, split by phase.

    python bench/ppo_iteration.py [--preset small] [--iterations 4] [--completion-tokens 64]

Same-run reference: a plain in-process PEFT step (forward, summed loss, backward, AdamW) on a batch
of the iteration's shape, so the policy and critic steps print as ratios against it.
"""

from __future__ import annotations

import argparse
import statistics
import time

from server import ROOT, start_server  # sets up sys.path and the environment first
from train_step import baseline_step, random_batch, timed
from transformers import AutoModelForCausalLM

from app.models.embedded import build_embedded_model
from examples.rl_task import PPOTrainer, make_task

PHASES = ("sample", "critic_values", "policy_step", "critic_step", "weight_sync")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="small", choices=["tiny", "small"])
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--completion-tokens", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--critic-trainer", action="store_true", help="critics on a worker group of their own")
    args = parser.parse_args()
    import tinker

    path = build_embedded_model(args.preset, ROOT / "models" / args.preset)
    vocab = AutoModelForCausalLM.from_pretrained(path).config.vocab_size
    name = f"tinker-serve/{args.preset}"
    group = {"num_workers": args.workers, "cpus_per_worker": 1}
    base = {"name": name, "path": str(path), "trainer": group, "sampler": {"kv_cache_mib": 128}}
    if args.critic_trainer:
        base["critic_trainer"] = group
    url, _ = start_server([base], engine={"max_lora_rank": 8})
    service = tinker.ServiceClient(base_url=url, api_key="tml-bench")
    policy = service.create_lora_training_client(base_model=name, rank=8, seed=0).result()
    critic = service.create_lora_training_client(
        base_model=name, rank=8, seed=0, user_metadata={"model_role": "critic"}
    ).result()
    sampler = policy.save_weights_and_get_sampling_client().result()
    task = make_task(policy.get_tokenizer(), sampler, completion_tokens=args.completion_tokens)
    ppo = PPOTrainer(policy, critic, task, group_size=args.group_size, sampler=sampler)
    sequences = len(task.prompts) * args.group_size
    length = max(len(p) for p in task.prompts) + args.completion_tokens - 1
    print(
        f"\npreset={args.preset}: {sequences} sequences x {args.completion_tokens} sampled tokens per iteration; "
        f"policy and critic rank 8, {args.workers} trainer workers"
        f"{' each' if args.critic_trainer else ' shared'}; 1 warm-up + {args.iterations} iterations",
        flush=True,
    )
    reference = baseline_step(path, random_batch(sequences, length, vocab), threads=args.workers)
    ppo.iteration(seed=0)
    reference()
    splits, references, rewards = [], [], []
    for i in range(args.iterations):
        started = time.perf_counter()
        rewards.append(ppo.iteration(seed=(i + 1) * 1000)["reward"])
        splits.append({**ppo.phase_seconds, "total": time.perf_counter() - started})
        references.append(timed(reference))
        print(f"iteration {i}: {splits[-1]['total']:.2f} s, mean reward {rewards[-1]:.3f}", flush=True)
    ref = statistics.median(references)
    total = statistics.median(s["total"] for s in splits)
    sampled = sequences * args.completion_tokens
    print(f"\n{'phase':>14} {'median s':>9} {'share':>6}  notes")
    for phase in (*PHASES, "total"):
        seconds = statistics.median(s[phase] for s in splits)
        note = ""
        if phase == "sample":
            note = f"{sampled / seconds:.0f} tok/s sampled"
        elif phase in ("policy_step", "critic_step"):
            note = f"{seconds / ref:.2f} x the in-process PEFT step ({ref:.3f} s, same shape, same run)"
        print(f"{phase:>14} {seconds:9.3f} {seconds / total:6.0%}  {note}", flush=True)
    service.close("success").result()


if __name__ == "__main__":
    main()
