"""ModelInput chunks as the codec meets them: text, images (kept whole, their positions held by placeholders until a
rank decodes them; checked against the base by app.training_data.validation) and the rest, refused as a user error
naming the chunk's type and position: audio (`dmel`) is not served, and an `image_asset_pointer` names nothing this
server can read (app.images.checks.pointer_refusal says why).
"""

from __future__ import annotations

import numpy as np

from app.errors import LimitExceeded, UserError
from app.protocol.bounds import CountLimits
from app.training_data.batch import IMAGE_PLACEHOLDER, BatchImage

TEXT = "encoded_text"
IMAGE = "image"


def not_text(field: str, kind: object) -> UserError:
    """The error for a chunk of type `kind` at `field` (e.g. ``data[0].model_input[1]``) that is neither text nor an
    image."""
    why = "audio is not served" if kind == "dmel" else "send an image's bytes in an image chunk"
    return UserError(
        f"{field} is a {kind or 'empty'!r} chunk; {why} (encoded_text and image chunks are taken)", field=field
    )


class ImageCounter:
    """One request's image chunks as decoded: each one's declared tokens bounded before its placeholders are made
    (`expected_tokens`, which the SDK counts a ModelInput's length by), and their number."""

    def __init__(self, counts: CountLimits) -> None:
        self.counts = counts
        self._images: list[BatchImage] = []

    @property
    def images(self) -> tuple[BatchImage, ...]:
        return tuple(self._images)

    def add(self, datum: int, at: int, field: str, data: bytes, fmt: str, expected: int | None) -> np.ndarray:
        """Keep the image chunk at `field`, at position `at` of datum `datum`; its placeholder tokens."""
        counts = self.counts
        if len(self._images) >= counts.max_images_per_request:
            raise LimitExceeded(
                f"{field}: more than {counts.max_images_per_request} images in one request "
                "(limits.max_images_per_request)",
                field=field,
            )
        if expected is None:
            raise UserError(
                f"{field}.expected_tokens is required (the SDK counts a ModelInput's length by it)",
                field=f"{field}.expected_tokens",
            )
        if not 0 < expected <= counts.max_vision_tokens_per_datum:
            raise LimitExceeded(
                f"{field}.expected_tokens is {expected}; it must be in [1, {counts.max_vision_tokens_per_datum}] "
                "(limits.max_vision_tokens_per_datum)",
                field=f"{field}.expected_tokens",
            )
        self._images.append(BatchImage(field, datum, at, expected, fmt, data))
        return np.full(expected, IMAGE_PLACEHOLDER, dtype=np.int64)
