"""The tiny vision-language presets (Qwen3.5 and Qwen3-VL with their vision towers): the tokenizer carries Qwen-VL's
image tokens with the ids its config names, and a name it is registered under resolves offline, in a fresh interpreter,
to the cookbook's tokenizer and image processor, whose renderer for the family wraps an image in vision start/end
around an image chunk of as many tokens as the processor makes of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.models.embedded import VISION_TOKENS, build_embedded_model
from app.models.hub_cache import register
from tests.conftest import ROOT

PROBE = """
import json
import numpy as np
from PIL import Image
from tinker_cookbook.image_processing_utils import get_image_processor
from tinker_cookbook.renderers import get_renderer
from tinker_cookbook.tokenizer_utils import get_tokenizer

name = {name!r}
processor, tokenizer = get_image_processor(name), get_tokenizer(name)
image = Image.fromarray((np.random.RandomState(0).rand(100, 150, 3) * 255).astype("uint8"))
renderer = get_renderer({renderer!r}, tokenizer, image_processor=processor)
prompt = renderer.build_generation_prompt([{{"role": "user", "content": [
    {{"type": "image", "image": image}}, {{"type": "text", "text": "What is it?"}}]}}])
grid = processor(images=[image], return_tensors="pt")["image_grid_thw"]
print(json.dumps({{"chunks": [c.model_dump(mode="json", exclude={{"data"}}) for c in prompt.chunks],
                  "processor_tokens": int(grid.prod()) // processor.merge_size**2,
                  "ids": tokenizer.convert_tokens_to_ids({tokens!r})}}))
"""


@pytest.mark.parametrize(
    ("preset", "renderer"), [("tiny-qwen3_5", "qwen3_5_disable_thinking"), ("tiny-qwen3-vl", "qwen3_vl_instruct")]
)
def test_a_registered_vision_preset_renders_images_offline(
    preset: str, renderer: str, presets_dir: Path, tmp_path: Path
) -> None:
    model = build_embedded_model(preset, presets_dir / preset)
    config = json.loads((model / "config.json").read_text())
    cache = tmp_path / "hub"
    register("tinker-serve/tiny-vlm", model, cache)

    probe = PROBE.format(name="tinker-serve/tiny-vlm", tokens=list(VISION_TOKENS), renderer=renderer)
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.splitlines()[-1])

    start, end, image, video = found["ids"]
    assert [start, end, image, video] == [
        config[f"{k}_token_id"] for k in ("vision_start", "vision_end", "image", "video")
    ]
    assert len(set(found["ids"])) == 4 and max(found["ids"]) < config["text_config"]["vocab_size"]
    kinds = [c["type"] for c in found["chunks"]]
    at = kinds.index("image")
    assert found["chunks"][at - 1]["tokens"][-1] == start and found["chunks"][at + 1]["tokens"][0] == end
    assert found["chunks"][at]["expected_tokens"] == found["processor_tokens"] == 15  # 100x150 -> 96x160: 3x5 tokens
