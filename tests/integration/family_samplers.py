"""Run as `python -m tests.integration.family_samplers OUT_DIR PRESETS_DIR CHECK...` (tests/integration/
test_family_samplers.py does, in processes of its own, so vLLM's general plugins never load into the test session):
for each tiny preset named, one family after another, the trainer's engine (app.training.engine) trains two adapters,
MLP-only and attention + MLP, exports them as the Trainer does, and the Sampler's engine (app.sampling.engine.
SamplerEngine, the Sampler replica's own vLLM set-up: the family's options, its zero adapter, its plugins) loads both
and samples from the base and from each; the trainer's logprobs of each sampled sequence are computed beside them. On
a vision-language preset the attention + MLP adapter also samples after a prompt with an image (`image`), which the
trainer reads through its vision tower. `kv_fit` among the checks: _fits_its_kv_cache. The presets are built into
PRESETS_DIR (or found there). Prints one JSON line a check."""

from __future__ import annotations

import asyncio
import io
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from app.config import SamplerConfig
from app.images.tokens import VisionSpec
from app.messages import AdamParams, AdapterSpec
from app.models.embedded import build_embedded_model
from app.models.families import family_of
from app.models.model_config import model_shape
from app.models.vision_base import image_token_id
from app.sampling.engine import SamplerEngine
from app.sampling.params import SampleArgs, SampleImage
from app.training.base_model import load_base_model
from app.training.engine import TrainingEngine
from app.training.vision import VisionTower
from app.training_data.batch import IMAGE_PLACEHOLDER, BatchImage, PackedBatch
from tests.unit.training.sharded_ranks import batch_of

ADAPTERS = {"mlp": AdapterSpec(rank=8, seed=3, train_attn=False), "all": AdapterSpec(rank=8, seed=3)}
PROMPT = tuple(range(5, 25))
KV_FIT = "kv_fit"  # the name of _fits_its_kv_cache's check among the presets'
SAMPLER = SamplerConfig(kv_cache_mib=32, dtype="float32", max_loras=2, max_cpu_loras=3, max_num_seqs=4)


def _logprobs(
    engine: TrainingEngine, model_id: str, tokens: list[int], images: tuple[SampleImage, ...] = ()
) -> np.ndarray:
    """The trainer's logprobs of tokens[1:] given their prefixes (`images`: the prompt's, at their image pads)."""
    ids = np.asarray(tokens, np.int64)
    inputs = ids[:-1].copy()
    for image in images:
        inputs[image.start : image.start + image.length] = IMAGE_PLACEHOLDER
    batch = PackedBatch(
        inputs,
        np.array([0, len(ids) - 1]),
        {"target_tokens": ids[1:], "weights": np.ones(len(ids) - 1, np.float32)},
        tuple(BatchImage("image", 0, image.start, image.length, "png", image.data) for image in images),
    )
    return np.asarray(
        engine.forward_backward(model_id, "cross_entropy", {}, batch, forward_only=True).outputs["logprobs"]
    )


async def _check(preset: str, out: Path, presets: Path) -> dict:
    started = time.monotonic()
    path = build_embedded_model(preset, presets / preset)
    engine = TrainingEngine(load_base_model(str(path)), vision=VisionTower.load(str(path), torch.float32, "cpu"))
    losses: dict[str, list[float]] = {}
    for name, spec in ADAPTERS.items():
        engine.create_model(name, spec)
        batch, losses[name] = batch_of([12, 9, 7, 10], seed=1), []
        for _ in range(4):
            losses[name].append(engine.forward_backward(name, "cross_entropy", {}, batch, forward_only=False).loss_sum)
            engine.optim_step(name, AdamParams(learning_rate=1e-2))
        engine.save_adapter(name, out / f"{preset}-{name}")
    sampler = await SamplerEngine.start(
        str(path),
        SAMPLER,
        max_lora_rank=8,
        max_model_len=256,
        work_dir=out / f"{preset}-sampler",
        max_images=1 if VisionSpec.of_model(path) else 0,
    )
    try:
        adapters = {name: await sampler.load_adapter(str(out / f"{preset}-{name}")) for name in ADAPTERS}
        args = SampleArgs(PROMPT, 1, 12, 1.0, -1, 1.0, 3, (), (), True, False, 0, 0, None)
        prompts = [(name, name, args) for name in ADAPTERS]  # (what is checked, the adapter, the prompt)
        with_image = _with_image(path, args)
        if with_image is not None:
            prompts.append(("image", "all", with_image))
        differences = {}
        for check, name, prompt in prompts:
            (sequence,) = (await sampler.sample(prompt, adapters[name])).sequences
            expected = _logprobs(engine, name, [*prompt.prompt, *sequence.tokens], prompt.images)
            differences[check] = float(np.abs(np.asarray(sequence.logprobs) - expected[-len(sequence.tokens) :]).max())
    finally:
        sampler.shutdown()
    family = family_of(model_shape(str(path)).model_type).name
    return {
        "family": family,
        "losses": losses,
        "max_abs_difference": differences,
        "seconds": time.monotonic() - started,
    }


def _with_image(path: Path, args: SampleArgs) -> SampleArgs | None:
    """On a vision-language base, `args` with a 48x48 noise image after the prompt's first 3 tokens, as many image
    pads as the server counts for it (4 on the tiny presets' processor); None on a text-only base."""
    spec, pad = VisionSpec.of_model(path), image_token_id(path)
    if spec is None or pad is None:
        return None
    pixels = (np.random.default_rng(0).random((48, 48, 3)) * 255).astype("uint8")
    data = io.BytesIO()
    Image.fromarray(pixels).save(data, "PNG")
    image = SampleImage(start=3, length=spec.tokens(48, 48), data=data.getvalue())
    prompt = (*args.prompt[:3], *[pad] * image.length, *args.prompt[3:])
    return replace(args, prompt=prompt, images=(image,))


async def _fits_its_kv_cache(out: Path, presets: Path) -> dict:
    """The small preset (131,072 positions) behind a 16 MiB float32 KV cache, which holds fewer: the Sampler's
    max_model_len is what the server derives from the cache (app.models.model_config), and vLLM must start with it
    and sample a sequence that long (a max_model_len to the token of the cache's bytes failed vLLM's check)."""
    path = build_embedded_model("small", presets / "small")
    shape = model_shape(str(path))
    config = SAMPLER.model_copy(update={"kv_cache_mib": 16})
    held = shape.kv_cache_tokens(config.kv_cache_mib * 2**20, 4)
    assert held is not None
    sampler = await SamplerEngine.start(
        str(path), config, max_lora_rank=8, max_model_len=held, work_dir=out / "small-sampler"
    )
    try:
        prompt = tuple(range(5, held - 1))
        args = SampleArgs(prompt, 1, 1, 1.0, -1, 1.0, 3, (), (), True, False, 0, 0, None)
        (sequence,) = (await sampler.sample(args, sampler.base_adapter)).sequences
    finally:
        sampler.shutdown()
    return {"context": shape.context_length, "max_model_len": held, "sampled": len(prompt) + len(sequence.tokens)}


def main(out: Path, presets: Path, names: list[str]) -> None:
    for name in names:
        if name == KV_FIT:
            print(json.dumps({KV_FIT: asyncio.run(_fits_its_kv_cache(out, presets))}), flush=True)
        else:
            print(json.dumps({"preset": name, **asyncio.run(_check(name, out, presets))}), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:])
