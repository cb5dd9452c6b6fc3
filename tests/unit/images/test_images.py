"""Images read from their headers (no decoding), their vision tokens against transformers' own Qwen-VL processor,
and the checks of an image chunk: each bound, the format, a wrong expected_tokens, named by field and limit."""

from __future__ import annotations

import io
import struct
import zlib

import pytest
from PIL import Image

from app.config import LimitsConfig
from app.errors import LimitExceeded, UserError
from app.images.checks import ImageBudget, ImageLimits, text_only
from app.images.header import NotAnImage, read_header
from app.images.tokens import VisionSpec

# the tiny vision preset's processor (app.models.embedded) and the real Qwen3.5 checkpoints'
TINY = {
    "patch_size": 16,
    "merge_size": 2,
    "temporal_patch_size": 2,
    "size": {"shortest_edge": 32 * 32, "longest_edge": 128 * 128},
}
QWEN3_5 = {
    "patch_size": 16,
    "merge_size": 2,
    "temporal_patch_size": 2,
    "size": {"shortest_edge": 65536, "longest_edge": 16777216},
}
SIZES = [(1, 1), (100, 150), (150, 100), (31, 33), (500, 7), (1000, 1000), (64, 12800), (4000, 3000), (448, 448)]


def _encode(fmt: str, size: tuple[int, int], **options: object) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, (10, 200, 30)).save(buf, format=fmt, **options)
    return buf.getvalue()


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "GIF", "WEBP"])
@pytest.mark.parametrize("size", [(1, 1), (300, 17), (4000, 3000)])
def test_the_header_gives_the_format_and_size_pil_decodes(fmt: str, size: tuple[int, int]) -> None:
    header = read_header(_encode(fmt, size))
    assert (header.format, header.width, header.height) == (fmt.lower(), *size)


@pytest.mark.parametrize("options", [{"progressive": True}, {"exif": b"Exif\x00\x00" + b"\x00" * 300}])
def test_a_jpeg_header_is_found_past_other_segments(options: dict[str, object]) -> None:
    assert read_header(_encode("JPEG", (640, 480), **options)).pixels == 640 * 480


@pytest.mark.parametrize("options", [{"lossless": True}, {"exif": b"Exif\x00\x00abc"}])
def test_webp_lossless_and_extended_headers(options: dict[str, object]) -> None:
    header = read_header(_encode("WEBP", (333, 222), **options))
    assert (header.width, header.height) == (333, 222)


def _png_claiming(width: int, height: int, size: int) -> bytes:
    """A valid-looking PNG whose IHDR claims width x height, padded to `size` bytes (never decodable as claimed)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = struct.pack(">I", 13) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    return (b"\x89PNG\r\n\x1a\n" + chunk).ljust(size, b"\x00")


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"hello world",
        b"\x89PNG\r\n\x1a\n\x00",
        b"\xff\xd8\xff\xe0\x00\x10JFIF",
        _png_claiming(0, 10, 64),
        b"GIF89a\x01",
    ],
)
def test_what_is_not_a_readable_image_is_named(data: bytes) -> None:
    with pytest.raises(NotAnImage):
        read_header(data)


@pytest.mark.parametrize("config", [TINY, QWEN3_5], ids=["tiny", "qwen3_5"])
def test_vision_tokens_match_transformers_processor(config: dict[str, object]) -> None:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    processor = Qwen2VLImageProcessorPil(**config)
    spec = VisionSpec.from_processor_config(config)
    for width, height in SIZES:
        expected = processor.get_number_of_image_patches(height, width, images_kwargs={}) // 4
        assert spec.tokens(width, height) == expected, (width, height)
    image = Image.new("RGB", (150, 100))
    grid = processor(images=[image], return_tensors="pt")["image_grid_thw"][0].tolist()
    assert list(spec.grid(150, 100)) == grid


def _budget(**limits: int) -> ImageBudget:
    return ImageBudget(VisionSpec.from_processor_config(TINY), ImageLimits.of(LimitsConfig(**limits)))


def test_an_image_chunk_passes_with_its_tokens() -> None:
    header, tokens = _budget().check(0, "data[0].model_input[1]", _encode("PNG", (150, 100)), "png", 15)
    assert (header.width, header.height, tokens) == (150, 100, 15)
    assert _budget().check(0, "f", _encode("JPEG", (150, 100)), "jpeg", None)[1] == 15  # expected_tokens left out


def test_a_wrong_expected_tokens_names_the_chunk() -> None:
    with pytest.raises(UserError, match=r"data\[0\]\.model_input\[1\]\.expected_tokens is 14.*makes 15") as info:
        _budget().check(0, "data[0].model_input[1]", _encode("PNG", (150, 100)), "png", 14)
    assert info.value.field == "data[0].model_input[1].expected_tokens"


def test_a_small_png_claiming_100_megapixels_is_refused_by_its_header() -> None:
    bomb = _png_claiming(10_000, 10_000, 10_000)
    with pytest.raises(
        LimitExceeded, match=r"10000x10000 = 100000000 pixels, over 40000000 \(limits.max_image_pixels\)"
    ):
        _budget().check(0, "data[0].model_input[1]", bomb, "png", None)


@pytest.mark.parametrize(
    ("limits", "match"),
    [
        (
            {"max_image_bytes": 1024},
            r"data\[1\]\.model_input\[0\]\.data has \d+ bytes, over 1024 \(limits.max_image_bytes\)",
        ),
        ({"max_images_per_request": 1}, r"more than 1 images in one request \(limits.max_images_per_request\)"),
        ({"max_vision_tokens_per_datum": 20}, r"make 30 vision tokens, over 20 \(limits.max_vision_tokens_per_datum\)"),
    ],
)
def test_each_bound_is_named(limits: dict[str, int], match: str) -> None:
    budget = _budget(**limits)
    image = _encode("PNG", (150, 100), compress_level=0)
    if limits.get("max_image_bytes") is None:
        budget.check(1, "data[1].model_input[0]", image, "png", 15)
    with pytest.raises(LimitExceeded, match=match):
        budget.check(1, "data[1].model_input[0]", image, "png", 15)


def test_a_format_the_bytes_contradict_is_refused() -> None:
    with pytest.raises(UserError, match="is a jpeg image but format says 'png'"):
        _budget().check(0, "f", _encode("JPEG", (10, 10)), "png", None)
    with pytest.raises(UserError, match=r"f.format is 'gif'; expected one of \['png', 'jpeg'\]"):
        _budget().check(0, "f", _encode("GIF", (10, 10)), "gif", None)


def test_refusals_name_audio_and_text_only_bases() -> None:
    assert "audio (dmel) chunks are not served" in str(text_only("data[0].model_input[1]", "dmel"))
    assert "this base model is text-only" in str(text_only("prompt.chunks[1]", "image"))
