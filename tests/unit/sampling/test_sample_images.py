"""Images in asample prompts (app.sampling.params): an image chunk becomes its image-pad tokens and the image the
Sampler hands vLLM; every refusal names the chunk, from the header and the base64 length, before decoding."""

from __future__ import annotations

import base64
import io
import struct
import zlib
from dataclasses import asdict

import pytest
from PIL import Image

from app.config import LimitsConfig
from app.errors import LimitExceeded, UserError
from app.images.tokens import VisionSpec
from app.protocol.wire import SampleRequest
from app.sampling.params import SampleImage, sample_args
from app.training_data.validation import ModelLimits

PAD = 90
SPEC = VisionSpec(patch_size=16, merge_size=2, temporal_patch_size=2, min_pixels=32 * 32, max_pixels=128 * 128)
VLM = ModelLimits(vocab_size=100, max_context_length=64, vision=asdict(SPEC), image_token_id=PAD)
TEXT_ONLY = ModelLimits(vocab_size=100, max_context_length=64)
LIMITS = LimitsConfig(max_image_bytes=4096, max_image_pixels=10_000, max_images_per_prompt=2)


def png(width: int = 64, height: int = 64) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(out, "PNG")
    return out.getvalue()


def claimed_png(width: int, height: int) -> bytes:
    """A tiny PNG whose header claims width x height (its pixels are never there)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + chunk + struct.pack(">I", zlib.crc32(chunk))


def image_chunk(data: bytes, **fields: object) -> dict:
    return {"type": "image", "format": "png", "data": base64.b64encode(data).decode(), **fields}


def request(*chunks: dict) -> SampleRequest:
    return SampleRequest.model_validate(
        {
            "sampling_session_id": "s:sample:0",
            "seq_id": 0,
            "prompt": {"chunks": list(chunks)},
            "sampling_params": {"max_tokens": 4},
        }
    )


def text(*tokens: int) -> dict:
    return {"type": "encoded_text", "tokens": list(tokens)}


def refusal(chunks: list[dict], model: ModelLimits = VLM, limits: LimitsConfig = LIMITS) -> UserError:
    with pytest.raises(UserError) as caught:
        sample_args(request(*chunks), limits, model)
    return caught.value


def test_an_image_chunk_is_its_pad_tokens_and_the_image() -> None:
    data = png(64, 64)  # 64x64: a 4x4 patch grid, merged 2x2: 4 vision tokens
    args = sample_args(request(text(1, 2), image_chunk(data, expected_tokens=4), text(3)), LIMITS, VLM)
    assert args.prompt == (1, 2, PAD, PAD, PAD, PAD, 3)
    assert args.images == (SampleImage(start=2, length=4, data=data),)
    # expected_tokens is advisory: the server counts
    assert sample_args(request(image_chunk(data), text(3)), LIMITS, VLM).prompt == (PAD,) * 4 + (3,)


def test_a_wrong_expected_tokens_names_the_chunk() -> None:
    error = refusal([text(1), image_chunk(png(), expected_tokens=5)])
    assert error.field == "prompt.chunks[1].expected_tokens" and "4 tokens" in error.message


def test_images_on_a_text_only_base_are_refused() -> None:
    error = refusal([text(1), image_chunk(png())], model=TEXT_ONLY)
    assert error.field == "prompt.chunks[1]" and "text-only" in error.message


def test_pointer_chunks_are_refused_the_server_fetches_nothing() -> None:
    pointer = {"type": "image_asset_pointer", "format": "png", "location": "https://example.com/cat.png"}
    error = refusal([text(1), pointer])
    assert error.field == "prompt.chunks[1].location" and "fetches nothing" in error.message


def test_bounds_before_decoding() -> None:
    huge = refusal([text(1), image_chunk(claimed_png(10_000, 10_000))])  # 100 megapixels claimed in 33 bytes
    assert isinstance(huge, LimitExceeded) and "limits.max_image_pixels" in huge.message
    long = refusal([text(1), {"type": "image", "format": "png", "data": "A" * 8000}])  # refused by its length
    assert isinstance(long, LimitExceeded) and long.field == "prompt.chunks[1].data"
    many = refusal([image_chunk(png()), image_chunk(png()), image_chunk(png())])
    assert (
        isinstance(many, LimitExceeded)
        and "limits.max_images_per_prompt" in many.message
        and many.field == "prompt.chunks"
    )
    assert refusal([text(1), {"type": "image", "format": "png", "data": "not base64!"}]).field == (
        "prompt.chunks[1].data"
    )


def test_the_pad_token_in_text_is_refused_on_a_vlm() -> None:
    """vLLM would expand a stray pad as if it were the next image's."""
    assert refusal([text(1, PAD), image_chunk(png())]).field == "prompt.chunks[0].tokens"


def test_images_count_against_the_context() -> None:
    small = ModelLimits(vocab_size=100, max_context_length=8, vision=asdict(SPEC), image_token_id=PAD)
    error = refusal([text(1, 2, 3), image_chunk(png())], model=small)
    assert isinstance(error, LimitExceeded) and error.field in ("prompt", "sampling_params.max_tokens")
