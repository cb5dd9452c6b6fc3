"""tinker-cookbook's VLM classifier recipe, unmodified, trains on the families app's vision-language base (tiny
Qwen3.5-MoE with its vision tower, over PostgreSQL: conftest's `families_on_postgres`): the recipe's dataset class
(`vlm_classifier.data.ClassifierDataset`, renderer `qwen3_5_disable_thinking`, the image processor and tokenizer
resolved offline by the base's name) over a synthetic image-folder dataset of three colours built here, through the
cookbook's supervised loop as the recipe's train.py configures it; its NLL falls over a few steps."""

from __future__ import annotations

import asyncio
from pathlib import Path

import chz
import numpy as np
import pytest
from PIL import Image
from tinker_cookbook.recipes.vlm_classifier.data import ClassifierDataset, ClassifierDatasetConfig
from tinker_cookbook.supervised import train
from tinker_cookbook.supervised.types import SupervisedDataset, SupervisedDatasetBuilder

from tests.integration.conftest import FAMILY_BASES
from tests.integration.test_cookbook import _metric, offline_cookbook  # noqa: F401 - a fixture used by name

VLM_BASE = FAMILY_BASES["qwen3_5_moe"]
COLOURS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (20, 40, 230)}
STEPS = 4


def _image_folder(root: Path, per_class: int = 4) -> Path:
    """`datasets`' image-folder layout: train/<class>/<n>.png, small noisy images of one colour each."""
    rng = np.random.default_rng(0)
    for name, colour in COLOURS.items():
        (root / "train" / name).mkdir(parents=True)
        for n in range(per_class):
            pixels = np.clip(np.array(colour) + rng.normal(0, 20, (48, 64, 3)), 0, 255).astype("uint8")
            Image.fromarray(pixels).save(root / "train" / name / f"{n}.png")
    return root


@chz.chz
class ColoursBuilder(SupervisedDatasetBuilder):
    """The recipe's ClassifierDataset over the local dataset (its builders name Hub datasets)."""

    dataset: str
    model_name_for_tokenizer: str
    renderer_name: str
    batch_size: int

    def __call__(self) -> tuple[SupervisedDataset, SupervisedDataset | None]:
        config = ClassifierDatasetConfig(
            dataset=self.dataset,
            dataset_split="train",
            model_name_for_tokenizer=self.model_name_for_tokenizer,
            renderer_name=self.renderer_name,
            batch_size=self.batch_size,
            hflip_probability=0.0,
        )
        return ClassifierDataset(config), None


def test_the_vlm_classifier_recipe_trains_on_images(
    families_on_postgres: str,
    base_url: str,
    tmp_path: Path,
    offline_cookbook: None,  # noqa: F811
) -> None:
    log_path = tmp_path / "vlm"
    config = train.Config(
        log_path=str(log_path),
        model_name=VLM_BASE,
        recipe_name="recipe_vlm_classifier",
        renderer_name="qwen3_5_disable_thinking",
        dataset_builder=ColoursBuilder(
            dataset=str(_image_folder(tmp_path / "colours")),
            model_name_for_tokenizer=VLM_BASE,
            renderer_name="qwen3_5_disable_thinking",
            batch_size=6,
        ),
        learning_rate=1e-2,
        lr_schedule="constant",
        num_epochs=STEPS // 2,  # 12 images in batches of 6
        lora_rank=8,
        base_url=base_url,
        save_every=0,
        eval_every=0,
        max_steps=STEPS,
    )
    asyncio.run(train.main(config))
    nll = _metric(log_path, "train_mean_nll")
    print("vlm_classifier train_mean_nll:", [round(x, 3) for x in nll])
    assert len(nll) == STEPS and nll[-1] < 0.7 * nll[0], nll


@pytest.fixture(autouse=True)
def _datasets_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
