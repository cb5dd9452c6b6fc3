"""A vision-language base's frozen vision tower on a rank, and the inputs it makes of a micro-batch with images.

The ranks decode each image (never the ingress), the base's own image processor (transformers', from the model folder)
makes its patches, the vision tower and merger embed them (frozen: no gradients; LoRA adapts the language model only),
and their embeddings replace the token embeddings at the image's positions, as transformers' Qwen-VL models place them
at their image pads. Positions are Qwen-VL's multimodal rotary ones (time, height, width): text runs on from the last
position, an image's tokens take its grid's rows and columns, and the text after it starts past its larger side (the
same for a still image in Qwen2-VL's, Qwen3.5's and Qwen3-VL's `get_rope_index`).

Qwen3-VL's tower also gives DeepStack features: its mergers' outputs of some of its layers, each added to the hidden
states the language model's first layers give at the image positions (transformers' `Qwen3VLTextModel`, with
`visual_pos_masks` and `deepstack_visual_embeds`); here through forward hooks on those layers while the pass runs.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from safetensors import safe_open

from app.images.tokens import PROCESSOR_FILE
from app.training_data.batch import PackedBatch

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedModel

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

    @contextlib.contextmanager
    def inputs(
        self, part: PackedBatch, input_ids: torch.Tensor, model: PreTrainedModel | PeftModel
    ) -> Iterator[dict[str, torch.Tensor]]:
        """The adapted `model`'s forward arguments for the padded micro-batch (`input_ids`: `part`'s rows, as
        app.training.rows.padded makes them): its input embeddings, its images' in place, and its multimodal positions
        [3, N, L]; within it, a DeepStack tower's features join the first decoder layers' outputs."""
        embeds = model.get_input_embeddings()(torch.where(input_ids < 0, self.image_token_id, input_ids))
        pixels, grids = self._patches(part)
        with torch.no_grad():
            device = self.visual_device
            dtype = next(self.visual.parameters()).dtype
            out = self.visual(pixels.to(device=device, dtype=dtype), grid_thw=grids.to(device))
        rows: list[int] = []
        cols: list[int] = []
        positions = torch.zeros((3, *input_ids.shape), dtype=torch.long)
        layouts: dict[int, list[tuple[int, int, int]]] = {}
        for image, grid in zip(part.images, grids.tolist(), strict=True):
            rows += [image.datum] * image.tokens
            cols += range(image.position, image.position + image.tokens)
            layouts.setdefault(image.datum, []).append((image.position, grid[1], grid[2]))
        for row, length in enumerate(part.lengths.tolist()):
            positions[:, row, :length] = torch.from_numpy(self.positions(length, layouts.get(row, [])))
        at = (torch.tensor(rows, device=embeds.device), torch.tensor(cols, device=embeds.device))
        deepstack = DeepStack(at, getattr(out, "deepstack_features", None) or [])
        with deepstack.added(model):
            yield {
                "inputs_embeds": embeds.index_put(at, out.pooler_output.to(embeds.device, embeds.dtype)),
                "position_ids": positions.to(embeds.device),
            }

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


@dataclass(frozen=True)
class DeepStack:
    """A DeepStack tower's features of one micro-batch: the i-th, [image tokens, hidden], is added to the output of
    the language model's i-th decoder layer at the image tokens' (row, position) `at`, in the images' order."""

    at: tuple[torch.Tensor, torch.Tensor]
    features: list[torch.Tensor]

    @contextlib.contextmanager
    def added(self, model: PreTrainedModel | PeftModel) -> Iterator[None]:
        """Within it, each feature joins its layer's output in `model` (a forward hook on each of the first layers)."""
        layers = model.get_decoder().layers if self.features else []
        hooks = [
            layer.register_forward_hook(functools.partial(self._add, f)) for layer, f in zip(layers, self.features)
        ]
        try:
            yield
        finally:
            for hook in hooks:
                hook.remove()

    def _add(self, features: torch.Tensor, _layer: torch.nn.Module, _args: Any, hidden: torch.Tensor) -> torch.Tensor:
        return hidden.index_put(self.at, features.to(hidden.device, hidden.dtype), accumulate=True)


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
