"""The checks an image chunk passes before anything decodes it or any engine runs: its bytes, its header's format and
pixels, its vision tokens (from the base's processor) against the chunk's `expected_tokens`, and the request's image
count and each datum's vision tokens. Each failure is a user error naming the chunk (``data[0].model_input[1]``) and
the `limits` field that bounds it."""

from __future__ import annotations

from dataclasses import dataclass

from app.config import LimitsConfig
from app.errors import LimitExceeded, UserError
from app.images.header import ImageHeader, NotAnImage, read_header
from app.images.tokens import VisionSpec

CHUNK_FORMATS = ("png", "jpeg")  # what the SDK's ImageChunk and ImageAssetPointerChunk declare


@dataclass(frozen=True)
class ImageLimits:
    max_image_bytes: int
    max_image_pixels: int
    max_images_per_request: int
    max_vision_tokens_per_datum: int

    @classmethod
    def of(cls, limits: LimitsConfig) -> ImageLimits:
        return cls(
            limits.max_image_bytes,
            limits.max_image_pixels,
            limits.max_images_per_request,
            limits.max_vision_tokens_per_datum,
        )


def text_only(field: str, kind: object) -> UserError:
    """The error for a non-text chunk on a text-only base (or an audio chunk anywhere)."""
    what = "audio (dmel) chunks are not served" if kind == "dmel" else "this base model is text-only"
    return UserError(
        f"{field} is a {kind or 'empty'!r} chunk; {what}: send encoded_text chunks"
        f"{'' if kind == 'dmel' else ', or images to a vision-language base'}",
        field=field,
    )


def check_image(
    field: str,
    data: bytes,
    declared_format: str,
    limits: ImageLimits,
    formats: tuple[str, ...] = CHUNK_FORMATS,
    source: str = "data",
) -> ImageHeader:
    """The header of the image at `field` (its bytes from the chunk's `source`: its `data`, or the file its
    `location` names); a UserError before any decoding when it is over a byte or pixel bound or not the format it
    declares (one of `formats`)."""
    if declared_format not in formats:
        raise UserError(
            f"{field}.format is {declared_format!r}; expected one of {list(formats)}", field=f"{field}.format"
        )
    if len(data) > limits.max_image_bytes:
        raise LimitExceeded(
            f"{field}.{source} has {len(data)} bytes, over {limits.max_image_bytes} (limits.max_image_bytes)",
            field=f"{field}.{source}",
        )
    try:
        header = read_header(data)
    except NotAnImage as exc:
        raise UserError(f"{field}.{source} {exc}", field=f"{field}.{source}") from exc
    if header.format != declared_format:
        raise UserError(
            f"{field}.{source} is a {header.format} image but format says {declared_format!r}",
            field=f"{field}.format",
        )
    if header.pixels > limits.max_image_pixels:
        raise LimitExceeded(
            f"{field}.{source} is {header.width}x{header.height} = {header.pixels} pixels, over "
            f"{limits.max_image_pixels} (limits.max_image_pixels)",
            field=f"{field}.{source}",
        )
    return header


class ImageBudget:
    """One request's images: each checked as it is met, the request's count and each datum's vision tokens summed."""

    def __init__(self, spec: VisionSpec, limits: ImageLimits) -> None:
        self.spec, self.limits = spec, limits
        self.images = 0
        self._datum_tokens: dict[int, int] = {}

    def check(
        self,
        datum: int,
        field: str,
        data: bytes,
        declared_format: str,
        expected_tokens: int | None,
        formats: tuple[str, ...] = CHUNK_FORMATS,
    ) -> tuple[ImageHeader, int]:
        """The header and vision tokens of the image at `field` of datum `datum`; a UserError before any decoding
        when it is over a bound, not the format it declares (one of `formats`), or not `expected_tokens` long."""
        limits = self.limits
        self.images += 1
        if self.images > limits.max_images_per_request:
            raise LimitExceeded(
                f"{field}: more than {limits.max_images_per_request} images in one request "
                "(limits.max_images_per_request)",
                field=field,
            )
        header = check_image(field, data, declared_format, limits, formats)
        try:
            tokens = self.spec.tokens(header.width, header.height)
        except ValueError as exc:
            raise UserError(f"{field}.data {exc}", field=f"{field}.data") from exc
        if expected_tokens is not None and expected_tokens != tokens:
            raise UserError(
                f"{field}.expected_tokens is {expected_tokens}, but this base's processor makes "
                f"{tokens} tokens of a {header.width}x{header.height} image",
                field=f"{field}.expected_tokens",
            )
        total = self._datum_tokens.get(datum, 0) + tokens
        if total > limits.max_vision_tokens_per_datum:
            raise LimitExceeded(
                f"{field}: data[{datum}]'s images make {total} vision tokens, over "
                f"{limits.max_vision_tokens_per_datum} (limits.max_vision_tokens_per_datum)",
                field=field,
            )
        self._datum_tokens[datum] = total
        return header, tokens
