"""tinker-cookbook's VLM classifier recipe (`tinker_cookbook.recipes.vlm_classifier.train`), unmodified, against a
server with a vision-language base: `make serve SERVE_CONFIG=examples/vlm/serve_config.yaml`, then
`.venv/bin/python examples/vlm/classifier.py`.

The recipe loads its dataset by a Hub id (`dpdl-benchmark/caltech101`); `datasets` reads a local folder of that name
first, so this writes three classes of generated images there (examples/vlm/colours.py), in the working directory the
recipe runs in, and nothing is downloaded. It prints the recipe's NLL per step and its sampling evaluator's accuracy
before and after training (the evaluator samples the trained model with the image in the prompt).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from colours import RECIPE_DATASET, colour_image_folder  # examples/vlm/colours.py, beside this script


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="tinker-serve/tiny-qwen3_5", help="the served vision-language base")
    parser.add_argument("--workdir", type=Path, default=Path("state/vlm_classifier"))
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=6)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--lora-rank", type=int, default=8)
    return parser.parse_args()


def _metrics(experiment_dir: Path) -> list[dict]:
    # the recipe names its run directory (by dataset, model, rank, rate and date): this run's is the newest
    metrics = max(experiment_dir.glob("*/metrics.jsonl"), key=lambda path: path.stat().st_mtime)
    return [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]


def main() -> None:
    args = _arguments()
    workdir = args.workdir.resolve()
    colour_image_folder(workdir / RECIPE_DATASET, per_class={"train": 8, "test": 4})
    experiment_dir = workdir / "runs"
    recipe = [
        sys.executable, "-m", "tinker_cookbook.recipes.vlm_classifier.train",
        f"experiment_dir={experiment_dir}", f"base_url={args.base_url}", f"model_name={args.model}",
        "dataset=caltech101", "renderer_name=qwen3_5_disable_thinking", f"lora_rank={args.lora_rank}",
        f"batch_size={args.batch_size}", f"learning_rate={args.learning_rate}", "lr_schedule=constant",
        f"num_epochs={args.steps}", f"max_steps={args.steps + 1}", f"eval_every={args.steps}", "n_eval=12",
        "max_tokens=8", "save_every=0", "behavior_if_log_dir_exists=delete",
    ]  # fmt: skip
    env = os.environ | {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env.setdefault("TINKER_API_KEY", "tml-vlm-classifier")
    print("running:", " ".join(recipe[1:]), f"(in {workdir})", flush=True)
    subprocess.run(recipe, cwd=workdir, env=env, check=True)
    rows = _metrics(experiment_dir)
    print("train_mean_nll:", [round(row["train_mean_nll"], 3) for row in rows if "train_mean_nll" in row])
    print("accuracy:", {row["step"]: v for row in rows for k, v in row.items() if k.endswith("accuracy")})


if __name__ == "__main__":
    main()
