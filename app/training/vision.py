"""A vision-language base's frozen vision tower on a rank, and the inputs it makes of a micro-batch with images.

The ranks decode each image (never the ingress), the base's own image processor (transformers', from the model folder)
makes its patches, the vision tower and merger embed them (frozen: no gradients; LoRA adapts the language model only),
and their embeddings replace the token embeddings at the image's positions, as transformers' Qwen-VL models place them
at their image pads. Positions are Qwen-VL's multimodal rotary ones (time, height, width): text runs on from the last
position, an image's tokens take its grid's rows and columns, and the text after it starts past its larger side.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open

from app.images.tokens import PROCESSOR_FILE
from app.training_data.batch import PackedBatch

VISUAL_PREFIX = "model.visual."  # the vision tower's (and merger's) weights in a Qwen-VL checkpoint


class VisionTower:
    """The frozen vision tower, its image processor and where its embeddings go (the base's image token)."""

    def __init__(self, visual: torch.nn.Module, processor: Any, image_token_id: int, merge_size: int) -> None:
        self.visual, self.processor = visual, processor
        self.image_token_id, self.merge_size = image_token_id, merge_size

    @classmethod
    def load(cls, path: str, dtype: torch.dtype, device: str | torch.device) -> VisionTower | None:
        """The vision tower of the base at `path`; None for a text-only base (no image processor in its folder)."""
        if not (Path(path) / PROCESSOR_FILE).is_file():
            return None
        from transformers import AutoConfig, AutoImageProcessor, AutoModelForImageTextToText

        config = AutoConfig.from_pretrained(path)
        with torch.device("meta"):  # only to learn the tower's class
            tower_class = type(AutoModelForImageTextToText.from_config(config).model.visual)
        visual = tower_class._from_config(config.vision_config)
        visual.load_state_dict(_weights(Path(path), VISUAL_PREFIX), strict=True)
        for p in visual.parameters():
            p.requires_grad_(False)
        visual = visual.to(device=device, dtype=dtype).eval()
        processor = AutoImageProcessor.from_pretrained(path)
        return cls(visual, processor, int(config.image_token_id), int(config.vision_config.spatial_merge_size))

    def inputs(
        self, part: PackedBatch, input_ids: torch.Tensor, embed: torch.nn.Module
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The padded micro-batch's input embeddings, its images' in place, and its multimodal positions [3, N, L]
        (`input_ids`: `part`'s rows, as app.training.rows.padded makes them)."""
        ids = torch.where(input_ids < 0, self.image_token_id, input_ids)
        embeds = embed(ids)
        pixels, grids = self._patches(part)
        with torch.no_grad():
            device = self.visual_device
            dtype = next(self.visual.parameters()).dtype
            out = self.visual(pixels.to(device=device, dtype=dtype), grid_thw=grids.to(device))
        image_embeds = out.pooler_output.to(embeds.device, embeds.dtype)
        at, rows = 0, embeds.clone()
        positions = torch.zeros((3, *input_ids.shape), dtype=torch.long)
        layouts: dict[int, list[tuple[int, int, int]]] = {}
        for image, grid in zip(part.images, grids.tolist(), strict=True):
            rows[image.datum, image.position : image.position + image.tokens] = image_embeds[at : at + image.tokens]
            at += image.tokens
            layouts.setdefault(image.datum, []).append((image.position, grid[1], grid[2]))
        for row, length in enumerate(part.lengths.tolist()):
            positions[:, row, :length] = torch.from_numpy(self.positions(length, layouts.get(row, [])))
        return rows, positions.to(embeds.device)

    @property
    def visual_device(self) -> torch.device:
        return next(self.visual.parameters()).device

    def positions(self, length: int, images: list[tuple[int, int, int]]) -> np.ndarray:
        """One datum's multimodal positions [3, length]; `images`: each image's (position, grid h, grid w)."""
        out = np.zeros((3, length), dtype=np.int64)
        current = at = 0
        for position, grid_h, grid_w in images:
            out[:, at:position] = np.arange(current, current + position - at)
            current += position - at
            h, w = grid_h // self.merge_size, grid_w // self.merge_size
            rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
            span = slice(position, position + h * w)
            out[0, span], out[1, span], out[2, span] = current, current + rows.ravel(), current + cols.ravel()
            current, at = current + max(h, w), position + h * w
        out[:, at:] = np.arange(current, current + length - at)
        return out

    def _patches(self, part: PackedBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Every image of `part` decoded and made into patches: pixel values [patches, dim] and grids [images, 3]."""
        from PIL import Image

        decoded = []
        for image in part.images:
            with Image.open(io.BytesIO(image.data)) as opened:
                decoded.append(opened.convert("RGB"))
        out = self.processor(images=decoded, return_tensors="pt")
        return out["pixel_values"], out["image_grid_thw"]


def _weights(model_dir: Path, prefix: str) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors under `prefix` (the prefix dropped), from its one or many safetensors files."""
    index = model_dir / "model.safetensors.index.json"
    files = (
        sorted({f for k, f in json.loads(index.read_text())["weight_map"].items() if k.startswith(prefix)})
        if index.is_file()
        else ["model.safetensors"]
    )
    weights = {}
    for name in files:
        with safe_open(str(model_dir / name), "pt") as f:
            for key in f.keys():  # noqa: SIM118 - a safetensors handle, not a dict
                if key.startswith(prefix):
                    weights[key[len(prefix) :]] = f.get_tensor(key)
    return weights
