"""ModelInput chunks as the codec meets them: text, images (kept whole, their positions held by placeholders until a
rank decodes them; checked against the base by app.training_data.validation), image pointers (located as they are
met, their files read into image chunks once the whole body is decoded: app.images.assets) and the rest, refused as
a user error naming the chunk's type and position: audio (`dmel`) is not served.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from app.errors import LimitExceeded, UserError
from app.images.assets import NO_ASSETS, ImageAssets, Located
from app.protocol.bounds import CountLimits
from app.training_data.batch import IMAGE_PLACEHOLDER, BatchImage

TEXT = "encoded_text"
IMAGE = "image"
IMAGE_POINTER = "image_asset_pointer"  # the SDK's ImageAssetPointerChunk
IMAGE_KINDS = (IMAGE, IMAGE_POINTER)


def not_text(field: str, kind: object) -> UserError:
    """The error for a chunk of type `kind` at `field` (e.g. ``data[0].model_input[1]``) that is neither text nor an
    image."""
    why = "audio is not served" if kind == "dmel" else "send an image's bytes in an image chunk"
    taken = "encoded_text, image and image_asset_pointer chunks are taken"
    return UserError(f"{field} is a {kind or 'empty'!r} chunk; {why} ({taken})", field=field)


class ImageCounter:
    """One request's image chunks as decoded: each one's declared tokens bounded before its placeholders are made
    (`expected_tokens`, which the SDK counts a ModelInput's length by), and their number; pointer chunks located
    under `assets` as they are met and read by `images`."""

    def __init__(self, counts: CountLimits, assets: ImageAssets = NO_ASSETS) -> None:
        self.counts, self.assets = counts, assets
        self._images: list[BatchImage] = []
        self._pointed: dict[int, Located] = {}  # index in _images -> where its bytes lie

    def images(self, room: int | None = None) -> tuple[BatchImage, ...]:
        """The request's image chunks, each pointer's file read into its bytes (blocking: it reads files). The files
        together take at most `room` bytes: what is left of limits.max_request_bytes beside the body, as if they had
        been sent in it."""
        images, pointed = list(self._images), 0
        for i, located in self._pointed.items():
            image = images[i]
            images[i] = replace(image, data=self.assets.read(image.field, located, image.format))
            pointed += len(images[i].data)
            if room is not None and pointed > room:
                raise LimitExceeded(
                    f"{image.field}.location: the request's images by location make {pointed} bytes, over the "
                    f"{room} bytes of limits.max_request_bytes its body leaves them",
                    field=f"{image.field}.location",
                )
        return tuple(images)

    def point(self, datum: int, at: int, field: str, location: str, fmt: str, expected: int | None) -> np.ndarray:
        """Keep the pointer chunk at `field` (its location checked now, its file read by `images`) as `add` does."""
        located = self.assets.locate(field, location)
        placeholders = self.add(datum, at, field, b"", fmt, expected)
        self._pointed[len(self._images) - 1] = located
        return placeholders

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
