"""An image's format and size from its first bytes, without decoding it: PNG's IHDR, JPEG's start-of-frame, WebP's
VP8/VP8L/VP8X header and GIF's logical screen. A header that claims 100 megapixels is read as such in microseconds,
so the bounds are checked before anything pays to decode it."""

from __future__ import annotations

import struct
from dataclasses import dataclass

FORMATS = ("png", "jpeg", "webp", "gif")  # what ImageChunk.format allows (and what this module reads)
# JPEG's start-of-frame markers (baseline, progressive, lossless, arithmetic): not DHT (C4), JPG (C8) or DAC (CC)
_JPEG_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
_JPEG_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})  # TEM, RSTn: markers without a length


class NotAnImage(ValueError):
    """Bytes that are not a PNG, JPEG, WebP or GIF this module can read the size of."""


@dataclass(frozen=True)
class ImageHeader:
    format: str  # one of FORMATS
    width: int
    height: int

    @property
    def pixels(self) -> int:
        return self.width * self.height


def read_header(data: bytes) -> ImageHeader:
    """The format and size `data` declares; NotAnImage when they cannot be read (or the size is 0)."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        header = _png(data)
    elif data.startswith(b"\xff\xd8"):
        header = _jpeg(data)
    elif data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        header = _webp(data)
    elif data[:6] in (b"GIF87a", b"GIF89a"):
        header = _gif(data)
    else:
        raise NotAnImage("is not a PNG, JPEG, WebP or GIF image (unknown signature)")
    if header.width <= 0 or header.height <= 0:
        raise NotAnImage(f"is a {header.format} image of {header.width}x{header.height} pixels")
    return header


def _need(data: bytes, end: int, kind: str) -> None:
    if len(data) < end:
        raise NotAnImage(f"is a truncated {kind} image (its header ends before its size)")


def _png(data: bytes) -> ImageHeader:
    _need(data, 24, "png")
    if data[12:16] != b"IHDR":
        raise NotAnImage("is a png image without IHDR as its first chunk")
    width, height = struct.unpack(">II", data[16:24])
    return ImageHeader("png", width, height)


def _jpeg(data: bytes) -> ImageHeader:
    at = 2
    while True:
        _need(data, at + 4, "jpeg")
        if data[at] != 0xFF:
            raise NotAnImage("is a jpeg image with a malformed marker before its frame header")
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in _JPEG_STANDALONE:
            at += 2
            continue
        if marker in (0xD9, 0xDA):  # end of image, start of scan: no frame header came first
            raise NotAnImage("is a jpeg image without a frame header before its scan")
        (length,) = struct.unpack(">H", data[at + 2 : at + 4])
        if marker in _JPEG_SOF:
            _need(data, at + 9, "jpeg")
            height, width = struct.unpack(">HH", data[at + 5 : at + 9])
            return ImageHeader("jpeg", width, height)
        if length < 2:
            raise NotAnImage("is a jpeg image with a malformed segment length")
        at += 2 + length


def _webp(data: bytes) -> ImageHeader:
    _need(data, 30, "webp")
    kind = data[12:16]
    if kind == b"VP8 ":  # lossy: the key frame's 14-bit sizes after its start code
        if data[23:26] != b"\x9d\x01\x2a":
            raise NotAnImage("is a webp (VP8) image without a key frame start code")
        width, height = struct.unpack("<HH", data[26:30])
        return ImageHeader("webp", width & 0x3FFF, height & 0x3FFF)
    if kind == b"VP8L":  # lossless: 14-bit sizes minus one after the signature byte
        if data[20] != 0x2F:
            raise NotAnImage("is a webp (VP8L) image without its signature")
        bits = int.from_bytes(data[21:25], "little")
        return ImageHeader("webp", (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1)
    if kind == b"VP8X":  # extended: 24-bit canvas sizes minus one
        return ImageHeader("webp", int.from_bytes(data[24:27], "little") + 1, int.from_bytes(data[27:30], "little") + 1)
    raise NotAnImage(f"is a webp image of an unknown kind {kind!r}")


def _gif(data: bytes) -> ImageHeader:
    _need(data, 10, "gif")
    width, height = struct.unpack("<HH", data[6:10])
    return ImageHeader("gif", width, height)
