"""The Sampler's vLLM prompt for images (app.sampling.vision): each image's pad run goes as one pad (vLLM's Qwen-VL
processor expands a pad into the image's run, so a run sent whole would grow), the images decoded to RGB; and a
prompt that vLLM expanded to another length than the request counted is the server's error."""

from __future__ import annotations

import asyncio
import io

import pytest
from PIL import Image

from app.errors import ServerError
from app.sampling.params import SampleArgs, SampleImage
from app.sampling.vision import Vision, check_expanded

PAD = 90


def png(color: tuple[int, int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGBA", (40, 30), (*color, 255)).save(out, "PNG")
    return out.getvalue()


def args(prompt: tuple[int, ...], *images: SampleImage) -> SampleArgs:
    return SampleArgs(prompt, 1, 4, 1.0, -1, 1.0, None, (), (), False, False, 0, 0, None, images=images)


def test_each_run_goes_as_one_pad_with_its_image() -> None:
    red, blue = png((255, 0, 0)), png((0, 0, 255))
    sample = args((1, PAD, PAD, PAD, 2, PAD, PAD, 3), SampleImage(1, 3, red), SampleImage(5, 2, blue))
    prompt = asyncio.run(Vision(image_token_id=PAD, max_images=2).engine_prompt(sample))
    assert prompt["prompt_token_ids"] == [1, PAD, 2, PAD, 3]
    first, second = prompt["multi_modal_data"]["image"]
    assert (first.mode, first.size, first.getpixel((0, 0))) == ("RGB", (40, 30), (255, 0, 0))
    assert second.getpixel((0, 0)) == (0, 0, 255)
    assert asyncio.run(Vision(PAD, 2).engine_prompt(args((1, 2)))) == {"prompt_token_ids": [1, 2]}


def test_an_expansion_of_another_length_is_refused() -> None:
    sample = args((1, PAD, PAD, 2), SampleImage(1, 2, png((0, 0, 0))))
    check_expanded(sample, 4)
    with pytest.raises(ServerError, match="counted 4"):
        check_expanded(sample, 5)
