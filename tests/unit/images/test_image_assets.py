"""Image pointers into an object store prefix (app.images.assets), on an S3-compatible server on loopback: an object
under the root is read with the root's filesystem settings; a key that leaves the prefix (`..`, another prefix or
bucket) is refused as outside with the same words whether an object is there or not; a missing object, a prefix and a
URL with a query are refused naming the location. (Local roots: tests/unit/api/test_image_pointers.py.)"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import replace

import pyarrow.fs as pafs
import pytest
from PIL import Image

from app.config import ImagesConfig, LimitsConfig
from app.errors import LimitExceeded, UserError
from app.images.assets import ImageAssets
from tests.s3 import s3_server

FIELD = "prompt.chunks[1]"


def _png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (40, 30), (5, 6, 7)).save(out, "PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def store() -> Iterator[tuple[ImageAssets, bytes]]:
    """Assets rooted at s3://assets-tests/images (the server's endpoint in the root's query), with images/cat.png,
    images/dir/x.png and, outside the root, secret/cat.png and images-2/cat.png."""
    with s3_server("assets-tests") as uri:
        root = uri.replace("/checkpoints?", "/images?")
        filesystem, _ = pafs.FileSystem.from_uri(root)
        png = _png()
        for key in ("images/cat.png", "images/dir/x.png", "secret/cat.png", "images-2/cat.png"):
            with filesystem.open_output_stream(f"assets-tests/{key}") as out:
                out.write(png)
        yield ImageAssets.of(ImagesConfig(asset_roots=[root]), LimitsConfig()), png


def _read(assets: ImageAssets, location: str) -> bytes:
    return assets.read(FIELD, assets.locate(FIELD, location), "png")


def _refusal(assets: ImageAssets, location: str) -> str:
    with pytest.raises(UserError) as caught:
        _read(assets, location)
    assert caught.value.field == f"{FIELD}.location", caught.value
    return caught.value.message


def test_an_object_under_the_root_is_read(store: tuple[ImageAssets, bytes]) -> None:
    assets, png = store
    assert _read(assets, "s3://assets-tests/images/cat.png") == png
    assert _read(assets, "s3://assets-tests/images/dir/../cat.png") == png


def test_keys_outside_the_prefix_read_the_same_whether_an_object_is_there_or_not(
    store: tuple[ImageAssets, bytes],
) -> None:
    assets, _ = store
    outside = f"{FIELD}.location is not inside this server's image asset roots (images.asset_roots)"
    for location in (
        "s3://assets-tests/images/../secret/cat.png",  # there
        "s3://assets-tests/images/../secret/none.png",  # not there
        "s3://assets-tests/images-2/cat.png",  # a prefix sharing the root's name
        "s3://other-bucket/images/cat.png",
        "gs://assets-tests/images/cat.png",
    ):
        assert _refusal(assets, location) == outside, location


def test_what_cannot_be_read_is_refused_naming_the_location(store: tuple[ImageAssets, bytes]) -> None:
    assets, _ = store
    assert "names no object" in _refusal(assets, "s3://assets-tests/images/none.png")
    assert "names a prefix" in _refusal(assets, "s3://assets-tests/images/dir")
    assert "no query or fragment" in _refusal(assets, "s3://assets-tests/images/cat.png?endpoint_override=evil:1")
    small = replace(assets, limits=replace(assets.limits, max_image_bytes=64))
    with pytest.raises(LimitExceeded, match=r"names a file of \d+ bytes, over 64 \(limits.max_image_bytes\)"):
        _read(small, "s3://assets-tests/images/cat.png")
