"""A tiny image-classification dataset generated offline: small noisy images of three colours in `datasets`'
image-folder layout (`<split>/<class>/<n>.png`), which `datasets.load_dataset(folder)` reads with a `ClassLabel`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

COLOURS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (20, 40, 230)}
# The Hub id of the dataset the cookbook's vlm_classifier recipe trains on as `dataset=caltech101`: `datasets` reads a
# local folder of that name first, so one written there stands in for it offline
RECIPE_DATASET = "dpdl-benchmark/caltech101"


def colour_image_folder(root: Path, per_class: dict[str, int], seed: int = 0) -> Path:
    """Write `per_class[split]` 64x48 images of each colour under `root/<split>/<colour>/`; returns `root`."""
    rng = np.random.default_rng(seed)
    for split, count in per_class.items():
        for name, colour in COLOURS.items():
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for n in range(count):
                pixels = np.clip(np.array(colour) + rng.normal(0, 20, (48, 64, 3)), 0, 255).astype("uint8")
                Image.fromarray(pixels).save(root / split / name / f"{n}.png")
    return root
