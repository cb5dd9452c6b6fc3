"""Off-policy stability: the cookbook's async RL loop (samples up to `max_steps_off_policy` steps stale) with
`ppo` and with `stable_reinforce`, at the same learning rates, on examples/cookbook_env.py's token-set task.
Prints each run's reward curve and, per loss and learning rate, the median over repeats of the second half's mean
reward and of the worst drop between consecutive steps.

    python bench/off_policy_losses.py [--lrs 1e-2,5e-2,1e-1] [--repeats 2] [--steps 14]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import tempfile
from pathlib import Path

from server import ROOT, start_server  # sets up sys.path and the environment first

from app.models.embedded import build_embedded_model
from examples.cookbook_env import TokenSetDatasetBuilder, token_set_targets
from examples.rl_task import PROMPTS

LOSSES = ("ppo", "stable_reinforce")


def run(url: str, model: str, targets: tuple[int, ...], loss: str, lr: float, args: argparse.Namespace) -> list[float]:
    """One async cookbook run; its per-step mean reward (runs differ by their sampling)."""
    from tinker_cookbook.rl import train

    log_path = Path(tempfile.mkdtemp(prefix=f"offpolicy-{loss}-"))
    config = train.Config(
        learning_rate=lr,
        dataset_builder=TokenSetDatasetBuilder(model_name=model, targets=targets, batches=args.steps),
        model_name=model,
        recipe_name=f"off-policy-{loss}",
        renderer_name="role_colon",
        max_tokens=8,
        lora_rank=8,
        log_path=str(log_path),
        base_url=url,
        eval_every=0,
        save_every=0,
        async_config=train.AsyncConfig(
            max_steps_off_policy=args.max_steps_off_policy, groups_per_batch=len(PROMPTS), loss_fn=loss
        ),
    )
    asyncio.run(train.main(config))
    rows = [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [row["env/all/reward/total"] for row in rows if "env/all/reward/total" in row]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lrs", default="1e-2,5e-2,1e-1")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--max-steps-off-policy", type=int, default=2)
    args = parser.parse_args()
    import tinker
    from tinker_cookbook.utils import cost_estimation

    os.environ.setdefault("TINKER_API_KEY", "tml-bench")
    cost_estimation._pricing_fetched = True  # no price list from the internet: this machine reaches loopback only
    path = build_embedded_model("tiny", ROOT / "models" / "tiny")
    model = "tinker-serve/tiny"
    url, _ = start_server(
        [{"name": model, "path": str(path), "trainer": {"num_workers": 1, "cpus_per_worker": 1}}],
        engine={"max_lora_rank": 8},
    )
    targets = token_set_targets(tinker.ServiceClient(base_url=url, api_key="tml-bench"), model)
    summary: dict[tuple[str, float], list[tuple[float, float]]] = {}
    for lr in (float(x) for x in args.lrs.split(",")):
        for repeat in range(args.repeats):
            for loss in LOSSES:
                rewards = run(url, model, targets, loss, lr, args)
                late = statistics.mean(rewards[len(rewards) // 2 :])
                worst_drop = max((a - b for a, b in itertools.pairwise(rewards)), default=0.0)
                summary.setdefault((loss, lr), []).append((late, worst_drop))
                print(f"lr={lr:g} run={repeat} {loss:>16}: " + " ".join(f"{r:.2f}" for r in rewards), flush=True)
    print(f"\nmax_steps_off_policy={args.max_steps_off_policy}, {args.repeats} runs each, {args.steps} steps, tiny")
    print(f"{'loss':>16} {'lr':>6} {'2nd-half reward (median)':>25} {'worst step drop (median)':>25}")
    for (loss, lr), runs in sorted(summary.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        late = statistics.median(r[0] for r in runs)
        drop = statistics.median(r[1] for r in runs)
        print(f"{loss:>16} {lr:>6g} {late:>25.3f} {drop:>25.3f}")


if __name__ == "__main__":
    main()
