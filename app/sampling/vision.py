"""Images in the Sampler's prompts: how vLLM is started on a vision-language base, and how a prompt with images
becomes vLLM's multimodal input.

A prompt's tokens hold each image as its run of image-pad tokens, as many as the SDK's `expected_tokens` (the count the
ingress checked against the image). vLLM expands every image-pad token it finds into the image's own run (Qwen-VL's
processor replaces `<|image_pad|>` with one pad per vision token), so each run goes to vLLM as a single pad: its
expansion gives the prompt back at the length the caller counted, which `check_expanded` verifies.
"""

from __future__ import annotations

import asyncio
import io
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.errors import ServerError
from app.models.vision_base import image_token_id

if TYPE_CHECKING:
    from PIL.Image import Image

    from app.sampling.params import SampleArgs


@dataclass(frozen=True)
class Vision:
    """A vision-language base as the Sampler serves it: its image-pad token and images per prompt."""

    image_token_id: int
    max_images: int

    def engine_options(self) -> dict[str, Any]:
        """vLLM's multimodal settings: the vision tower built, `max_images` images and no video per prompt."""
        return {"language_model_only": False, "limit_mm_per_prompt": {"image": self.max_images, "video": 0}}

    async def engine_prompt(self, args: SampleArgs) -> dict[str, Any]:
        """vLLM's prompt for `args`: its tokens with each image's run as one pad, and the images, decoded in a
        thread (never on the event loop)."""
        if not args.images:
            return {"prompt_token_ids": list(args.prompt)}
        tokens: list[int] = []
        end = 0
        for image in args.images:
            tokens += [*args.prompt[end : image.start], self.image_token_id]
            end = image.start + image.length
        tokens += args.prompt[end:]
        images = await asyncio.to_thread(lambda: [decode(image.data) for image in args.images])
        return {"prompt_token_ids": tokens, "multi_modal_data": {"image": images}}


def vision_of(model_path: str, max_images: int) -> Vision | None:
    """The base at `model_path` as the Sampler serves it: with `max_images` images a prompt on a vision-language
    base (app.models.vision_base), None on a text-only one."""
    token = image_token_id(Path(model_path))
    return None if token is None else Vision(image_token_id=token, max_images=max_images)


def decode(data: bytes) -> Image:
    """An image's pixels in RGB (the processor's input). The ingress checked its header and bounds."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        return image.convert("RGB")


def check_expanded(args: SampleArgs, expanded: int) -> None:
    """Fail when vLLM's prompt (its images expanded) is not the length the request counted: prompt logprobs would
    be misplaced."""
    if args.images and expanded != len(args.prompt):
        raise ServerError(
            f"the sampler's image processor gave a {expanded}-token prompt where the request counted "
            f"{len(args.prompt)}; the server's image token count disagrees with its processor"
        )
