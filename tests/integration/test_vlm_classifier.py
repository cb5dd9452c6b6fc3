"""tinker-cookbook's VLM classifier recipe, unmodified, trains and evaluates on the families app's vision-language
base (tiny Qwen3.5-MoE with its vision tower, over PostgreSQL: conftest's `families_on_postgres`): the recipe's own
entry point (`vlm_classifier.train.run_experiment`: its `caltech101` dataset builder, renderer
`qwen3_5_disable_thinking`, the image processor and tokenizer resolved offline by the base's name, its sampling
evaluator) over three colours of generated images (examples/vlm/colours.py) in a local folder named as the recipe's
Hub dataset, which `datasets` reads first. Its NLL falls over a few steps, and its evaluator samples the model with
the image in the prompt before and after training."""

from __future__ import annotations

from pathlib import Path

import pytest
from tinker_cookbook.recipes.vlm_classifier.train import ExperimentConfig, run_experiment

from examples.vlm.colours import RECIPE_DATASET, colour_image_folder
from tests.integration.conftest import FAMILY_BASES
from tests.integration.test_cookbook import _metric, offline_cookbook  # noqa: F401 - a fixture used by name

VLM_BASE = FAMILY_BASES["qwen3_5_moe"]
STEPS = 5


def test_the_vlm_classifier_recipe_trains_and_evaluates_on_images(
    families_on_postgres: str,
    base_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    offline_cookbook: None,  # noqa: F811
) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    colour_image_folder(tmp_path / RECIPE_DATASET, per_class={"train": 4, "test": 2})
    run_experiment(
        ExperimentConfig(
            experiment_dir=str(tmp_path / "runs"),
            base_url=base_url,
            model_name=VLM_BASE,
            dataset="caltech101",
            renderer_name="qwen3_5_disable_thinking",
            behavior_if_log_dir_exists="delete",
            learning_rate=1e-2,
            lr_schedule="constant",
            num_epochs=STEPS,  # 12 images in batches of 6
            batch_size=6,
            lora_rank=8,
            max_steps=STEPS,
            save_every=0,
            eval_every=STEPS - 1,  # before the first step and the last
            n_eval=6,
            max_tokens=8,
        )
    )
    (log_path,) = (tmp_path / "runs").iterdir()
    nll = _metric(log_path, "train_mean_nll")
    print("vlm_classifier train_mean_nll:", [round(x, 3) for x in nll])
    assert len(nll) == STEPS and nll[-1] < 0.7 * nll[0], nll
    accuracy = _metric(log_path, "accuracy")  # the sampling evaluator's, of 6 test images' greedy answers
    print("vlm_classifier accuracy:", accuracy)
    assert len(accuracy) == 2 and all(0.0 <= a <= 1.0 for a in accuracy), accuracy
