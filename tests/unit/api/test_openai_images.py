"""Images in /v1/chat/completions through the in-process API (tests/unit/api/conftest.py): what the ingress refuses,
each a 400 naming the content part, before any sampler is asked (there is none here)."""

from __future__ import annotations

import base64
import io
from dataclasses import asdict, replace
from typing import Any

import pytest
from PIL import Image

from app.images.tokens import VisionSpec
from tests.unit.api.conftest import BASE_MODEL, InProcessApi
from tests.unit.api.test_hostile_inputs import refused
from tests.unit.sampling.test_sample_images import claimed_png

SPEC = VisionSpec(patch_size=16, merge_size=2, temporal_patch_size=2, min_pixels=32 * 32, max_pixels=128 * 128)


def png_url(width: int = 32, height: int = 32) -> str:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (0, 90, 200)).save(out, "PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def chat(*parts: dict) -> dict:
    content = [{"type": "text", "text": "What is this?"}, *parts]
    return {"model": BASE_MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 4}


URL = "messages[0].content[{}].image_url.url"


def refused_image(response: Any, part: int) -> str:
    """The message of a 400 naming the image's URL (or, from the image checks, its `.data` / `.format`)."""
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"].startswith(URL.format(part)), error
    return str(error["message"])


def image(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


@pytest.fixture
def vlm(api: InProcessApi) -> InProcessApi:
    """The API with its base served as a vision-language model."""
    limits = api.services.model_limits
    limits[BASE_MODEL] = replace(limits[BASE_MODEL], vision=asdict(SPEC), image_token_id=7)
    return api


def test_an_image_on_a_text_only_base_is_refused(api: InProcessApi) -> None:
    body = refused(api.post("/v1/chat/completions", chat(image(png_url()))), "messages[0].content[1]")
    assert "text-only" in body["error"]["message"]


def test_http_urls_are_refused_the_server_fetches_nothing(vlm: InProcessApi) -> None:
    assert "fetches nothing" in refused_image(vlm.post("/v1/chat/completions", chat(image("https://x.org/a.png"))), 1)
    refused_image(vlm.post("/v1/chat/completions", chat(image("file:///etc/passwd"))), 1)


def test_other_media_parts_are_refused(vlm: InProcessApi) -> None:
    audio = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    refused(vlm.post("/v1/chat/completions", chat(audio)), "messages[0].content[1].type")
    video = {"type": "video_url", "video_url": {"url": "https://example.com/v.mp4"}}
    refused(vlm.post("/v1/chat/completions", chat(video)), "messages[0].content[1].type")


def test_image_bounds_from_the_header(make_api) -> None:  # type: ignore[no-untyped-def]
    api = make_api(max_image_pixels=10_000, max_images_per_prompt=2)
    limits = api.services.model_limits
    limits[BASE_MODEL] = replace(limits[BASE_MODEL], vision=asdict(SPEC), image_token_id=7)
    huge = "data:image/png;base64," + base64.b64encode(claimed_png(10_000, 10_000)).decode()
    assert "limits.max_image_pixels" in refused_image(api.post("/v1/chat/completions", chat(image(huge))), 1)
    three = chat(image(png_url()), image(png_url()), image(png_url()))
    body = refused(api.post("/v1/chat/completions", three), "messages")
    assert "limits.max_images_per_prompt" in body["error"]["message"]
    gif = chat(image("data:image/gif;base64,R0lGODlhAQABAAAAACw="))
    assert "data: URL" in refused_image(api.post("/v1/chat/completions", gif), 1)
    jpeg_claimed = chat(image(png_url().replace("image/png", "image/jpeg")))
    assert "format" in refused_image(api.post("/v1/chat/completions", jpeg_claimed), 1)
