"""A small image-classification dataset built offline, in the layout `datasets.load_dataset(folder)` reads (parquet
splits whose schema keeps the `image` and ClassLabel `label` features): what the cookbook's vlm_classifier recipe
(its data.py for training, its eval.py) loads by the name it is given."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

CLASSES = ("red_square", "blue_circle")  # the recipe reads "red square", "blue circle"
SIZE = 48  # 48x48: the tiny VLM presets' processor makes 64x64 of it, 4 vision tokens


def shape_image(label: int, seed: int) -> Image.Image:
    """A shape of the class `label` on a noisy background, its place and size varied by `seed`."""
    rng = np.random.default_rng(seed)
    image = Image.fromarray(rng.integers(0, 60, (SIZE, SIZE, 3), dtype=np.uint8))
    draw = ImageDraw.Draw(image)
    x, y = (int(v) for v in rng.integers(4, 16, 2))
    side = int(rng.integers(20, 28))
    if label == 0:
        draw.rectangle((x, y, x + side, y + side), fill=(220, 30, 30))
    else:
        draw.ellipse((x, y, x + side, y + side), fill=(30, 60, 220))
    return image


def build_image_dataset(folder: Path, per_class: dict[str, int]) -> Path:
    """`folder` holding each split of `per_class[split]` images of every class; returns it."""
    import datasets

    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=list(CLASSES))})
    for split_index, (split, count) in enumerate(per_class.items()):
        labels = [label for _ in range(count) for label in range(len(CLASSES))]
        images = [shape_image(label, seed=1000 * split_index + i) for i, label in enumerate(labels)]
        split_data = datasets.Dataset.from_dict({"image": images, "label": labels}, features=features)
        split_data.to_parquet(str(folder / "data" / f"{split}-00000-of-00001.parquet"))
    return folder
