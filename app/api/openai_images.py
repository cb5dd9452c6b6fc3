"""Images in /v1/chat/completions messages: `image_url` content parts whose URL is a `data:` URL (base64 png, jpeg or
webp), on a vision-language base and its checkpoints. The server fetches nothing: an http(s) URL is refused, as is
any other media part (audio, video, embeddings) and any image on a text-only base. Each image is checked from its
header against the limits (app.images.checks) before anything decodes it; vLLM decodes it in the Sampler."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from app.errors import UserError, require
from app.sampling.params import PromptVision, image_bytes

DATA_URL = re.compile(r"data:image/(png|jpeg|jpg|webp);base64,", re.IGNORECASE)
URL_FORMATS = ("png", "jpeg", "webp")
TEXT_PARTS = ("text",)  # parts that are text: every other part is an image_url or refused


def image_parts(messages: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(field, part) of each content part that is not text, in order."""
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in TEXT_PARTS and not (kind is None and isinstance(part, dict) and part.keys() <= {"text"}):
                yield f"messages[{i}].content[{j}]", part


def check_images(messages: list[dict[str, Any]], base_model: str, vision: PromptVision | None) -> int:
    """The vision tokens of the messages' images, each checked; a user error naming the part for anything else."""
    parts = list(image_parts(messages))
    if vision is not None:
        vision.check_count(len(parts), "messages")
    tokens = 0
    for field, part in parts:
        kind = part.get("type") if isinstance(part, dict) else None
        require(
            kind == "image_url",
            f"{field} is a {kind!r} part; this server takes text and image_url parts (images as data: URLs)",
            field=f"{field}.type",
        )
        require(
            vision is not None,
            f"{field} is an image; base model {base_model!r} is text-only",
            field=field,
        )
        assert vision is not None
        tokens += _image_tokens(f"{field}.image_url.url", part.get("image_url"), vision)
    return tokens


def _image_tokens(field: str, image_url: object, vision: PromptVision) -> int:
    url = image_url.get("url") if isinstance(image_url, dict) else None
    require(isinstance(url, str), f"{field} must be a string (a data: URL)", field=field)
    assert isinstance(url, str)
    head = url[:64].lower()
    if head.startswith(("http://", "https://")):
        raise UserError(
            f"{field} is an {head.split(':')[0]} URL: this server fetches nothing; send the image as a data: URL "
            "(data:image/png;base64,...)",
            field=field,
        )
    match = DATA_URL.match(url)
    if match is None:
        raise UserError(
            f"{field} must be a data: URL of a base64 image in one of {list(URL_FORMATS)} (data:image/png;base64,...)",
            field=field,
        )
    declared = "jpeg" if match.group(1).lower() == "jpg" else match.group(1).lower()
    data = image_bytes(url[match.end() :], field, vision.budget.limits.max_image_bytes)
    _, tokens = vision.budget.check(0, field, data, declared, None, formats=URL_FORMATS)
    return tokens
