"""Training on images, in process on the tiny vision-language presets (Qwen3.5 and Qwen3-VL, each with its vision
tower): a datum with an image chunk decoded by the codec as the SDK sends it runs through the frozen vision tower into
the LoRA-adapted language model; its logprobs equal transformers' whole model on the same image (its processor, image
pads and multimodal positions, and Qwen3-VL's DeepStack features added to its first layers), gradients reach the
language model's adapter only and the loss falls."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from tinker import types
from tinker.proto import request_conv

from app.errors import UserError
from app.messages import AdamParams, AdapterSpec
from app.models.embedded import build_embedded_model
from app.protocol.codec import decode_forward_backward
from app.training.base_model import load_base_model
from app.training.engine import TrainingEngine
from app.training.vision import VisionTower
from app.training_data.batch import PackedBatch
from tests.conftest import TINY_MODEL

ATOL = 1e-4  # float32: our blockwise logprobs and inputs_embeds path vs transformers' whole model
TEXT_BEFORE, TEXT_AFTER = [1, 847, 201], [276, 262, 223, 292, 33, 2]


# Qwen3-VL without its DeepStack features (transformers' whole model given none) against with them, on these images:
# 1.16 nats apart at most (ours with the injection removed: the same), where ours and the whole model agree to
# 4e-6; the check only needs them to matter far past ATOL
DEEPSTACK_MATTERS = 100 * ATOL
IMAGES = {"wide": (150, 100), "tall": (40, 90)}  # 96x160 -> 3x5 tokens; 32x96 -> 1x3
TOKENS = {"wide": 15, "tall": 3}


@pytest.fixture(scope="module", params=["tiny-qwen3_5", "tiny-qwen3-vl"])
def model_dir(presets_dir: Path, request: pytest.FixtureRequest) -> Path:
    return build_embedded_model(request.param, presets_dir / request.param)


def _png(size: tuple[int, int], seed: int) -> bytes:
    pixels = (np.random.RandomState(seed).rand(size[1], size[0], 3) * 255).astype("uint8")
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def _batch(images: list[tuple[bytes, int]]) -> PackedBatch:
    """One datum per image, as the SDK encodes it: text, the image chunk (vision start/end around it), text."""
    data = []
    for png, tokens in images:
        chunks = [
            types.EncodedTextChunk(tokens=[*TEXT_BEFORE, 2048]),
            types.ImageChunk(data=png, format="png", expected_tokens=tokens),
            types.EncodedTextChunk(tokens=[2049, *TEXT_AFTER]),
        ]
        length = len(TEXT_BEFORE) + 1 + tokens + 1 + len(TEXT_AFTER)
        targets = np.roll(np.array([*TEXT_BEFORE, 2048, *[0] * tokens, 2049, *TEXT_AFTER]), -1)
        weights = np.r_[np.zeros(length - len(TEXT_AFTER)), np.ones(len(TEXT_AFTER))].astype(np.float32)
        data.append(
            types.Datum(
                model_input=types.ModelInput(chunks=chunks),
                loss_fn_inputs={"target_tokens": targets, "weights": weights},
            )
        )
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=data, loss_fn="cross_entropy"), model_id="m", seq_id=0
    )
    body = request_conv.forward_backward_request_to_proto(request).SerializeToString()
    return decode_forward_backward(body, "application/x-protobuf", None, max_body_bytes=2**24).batch


def _engine(model_dir: Path) -> TrainingEngine:
    engine = TrainingEngine(
        load_base_model(str(model_dir)), vision=VisionTower.load(str(model_dir), torch.float32, "cpu")
    )
    engine.create_model("m", AdapterSpec(rank=8, seed=3))
    return engine


def _images() -> list[tuple[bytes, int]]:
    return [(_png(size, seed), TOKENS[name]) for seed, (name, size) in enumerate(IMAGES.items())]


def _whole_model_logprobs(model_dir: Path, batch: PackedBatch, images: list[tuple[bytes, int]], deepstack: bool = True):
    """transformers' whole vision-language model's logprobs of `batch`'s targets, one datum (one image) at a time;
    `deepstack=False`: its tower's DeepStack features left out (Qwen3-VL)."""
    from transformers import AutoImageProcessor, AutoModelForImageTextToText

    whole = AutoModelForImageTextToText.from_pretrained(model_dir).eval()
    processor = AutoImageProcessor.from_pretrained(model_dir)
    out = []
    for i, (png, _) in enumerate(images):
        ids = torch.from_numpy(
            np.where(batch.tokens < 0, whole.config.image_token_id, batch.tokens)[batch.datum_slice(i)]
        )[None]
        pixels = processor(images=[Image.open(io.BytesIO(png)).convert("RGB")], return_tensors="pt")
        with torch.no_grad():
            encoded = whole.model.get_image_features(pixels["pixel_values"], pixels["image_grid_thw"])
            if not deepstack:
                encoded.deepstack_features = []
            logits = whole(
                input_ids=ids,
                mm_token_type_ids=(ids == whole.config.image_token_id).int(),
                image_grid_thw=pixels["image_grid_thw"],
                mm_encoder_outputs={"image": encoded},
            ).logits[0]
        targets = torch.from_numpy(batch.loss_inputs["target_tokens"][batch.datum_slice(i)])
        out.append(torch.log_softmax(logits, -1).gather(1, targets[:, None])[:, 0].numpy())
    return np.concatenate(out)


def test_image_logprobs_equal_transformers_whole_model_and_only_the_language_model_learns(model_dir: Path) -> None:
    images = _images()
    batch = _batch(images)
    engine = _engine(model_dir)
    ours = engine.forward_backward("m", "cross_entropy", {}, batch, forward_only=True).outputs["logprobs"]
    np.testing.assert_allclose(ours, _whole_model_logprobs(model_dir, batch, images), atol=ATOL)

    losses = []
    for _ in range(4):
        out = engine.forward_backward("m", "cross_entropy", {}, batch, forward_only=False)
        losses.append(out.loss_sum)
        params = engine.loaded("m").params
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in params)
        engine.optim_step("m", AdamParams(learning_rate=1e-2))
    assert np.isfinite(losses).all() and losses[-1] < 0.8 * losses[0], losses
    assert not any(p.requires_grad or p.grad is not None for p in engine.vision.visual.parameters())
    assert not any("visual" in name for name in engine.adapter_state("m"))


def test_qwen3_vl_deepstack_features_change_its_logprobs(presets_dir: Path) -> None:
    """What the equality above rests on for Qwen3-VL: without its DeepStack features the whole model is far off."""
    model_dir = build_embedded_model("tiny-qwen3-vl", presets_dir / "tiny-qwen3-vl")
    images = _images()
    batch = _batch(images)
    ours = _engine(model_dir).forward_backward("m", "cross_entropy", {}, batch, forward_only=True).outputs["logprobs"]
    without = _whole_model_logprobs(model_dir, batch, images, deepstack=False)
    assert np.abs(ours - without).max() > DEEPSTACK_MATTERS


def test_a_text_only_base_refuses_an_image_naming_the_chunk() -> None:
    engine = TrainingEngine(load_base_model(str(TINY_MODEL)))
    engine.create_model("m", AdapterSpec(rank=8, seed=3))
    with pytest.raises(UserError, match=r"data\[0\]\.model_input\[1\] is an image; this base model is text-only"):
        engine.forward_backward("m", "cross_entropy", {}, _batch([(_png((150, 100), 0), 15)]), forward_only=True)
