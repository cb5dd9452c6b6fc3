"""How many vision tokens an image becomes on a Qwen-VL base: the processor's smart resize (each side a multiple of
patch x merge pixels, the area within [min_pixels, max_pixels], the aspect ratio kept) then one token per merge x merge
patches, the rule transformers' Qwen2VLImageProcessor.get_number_of_image_patches and vLLM apply. Read from the
base's preprocessor_config.json, so it needs no transformers."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROCESSOR_FILE = "preprocessor_config.json"
MAX_ASPECT_RATIO = 200  # the processor refuses a longer side over 200 times the shorter


@dataclass(frozen=True)
class VisionSpec:
    """What a base's image processor makes of an image's size."""

    patch_size: int
    merge_size: int
    temporal_patch_size: int
    min_pixels: int
    max_pixels: int

    @classmethod
    def from_processor_config(cls, config: dict[str, Any]) -> VisionSpec:
        """From a preprocessor_config.json's contents (`size`'s shortest/longest edge, or min/max_pixels)."""
        size = config.get("size") or {}
        return cls(
            patch_size=int(config["patch_size"]),
            merge_size=int(config.get("merge_size", 2)),
            temporal_patch_size=int(config.get("temporal_patch_size", 2)),
            min_pixels=int(config.get("min_pixels") or size["shortest_edge"]),
            max_pixels=int(config.get("max_pixels") or size["longest_edge"]),
        )

    @classmethod
    def of_model(cls, model_dir: Path) -> VisionSpec | None:
        """The spec of a model folder's processor; None for a text-only base (no processor file)."""
        path = Path(model_dir) / PROCESSOR_FILE
        if not path.is_file():
            return None
        return cls.from_processor_config(json.loads(path.read_text()))

    def resized(self, width: int, height: int) -> tuple[int, int]:
        """The (width, height) the processor resizes an image to; ValueError past the aspect ratio it takes."""
        if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
            raise ValueError(f"has an aspect ratio over {MAX_ASPECT_RATIO}:1 ({width}x{height})")
        factor = self.patch_size * self.merge_size
        h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
        if h_bar * w_bar > self.max_pixels:
            beta = math.sqrt(height * width / self.max_pixels)
            h_bar = max(factor, math.floor(height / beta / factor) * factor)
            w_bar = max(factor, math.floor(width / beta / factor) * factor)
        elif h_bar * w_bar < self.min_pixels:
            beta = math.sqrt(self.min_pixels / (height * width))
            h_bar, w_bar = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
        return w_bar, h_bar

    def grid(self, width: int, height: int) -> tuple[int, int, int]:
        """The vision tower's patch grid (t, h, w) of one image: Qwen-VL's `image_grid_thw`."""
        w, h = self.resized(width, height)
        return 1, h // self.patch_size, w // self.patch_size

    def tokens(self, width: int, height: int) -> int:
        """The image's vision tokens in the language model (its image pads)."""
        t, h, w = self.grid(width, height)
        return t * h * w // self.merge_size**2
