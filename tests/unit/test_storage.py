"""Checkpoint path formatting and parsing, and the directory each path maps to."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.errors import UserError
from app.storage import checkpoint_path, parse_tinker_path


def test_round_trip_and_directory() -> None:
    path = checkpoint_path("abc:train:0", "sampler_weights", "step-10")
    assert path.uri == "tinker://abc:train:0/sampler_weights/step-10"
    assert parse_tinker_path(path.uri) == path
    assert path.directory(Path("/ckpt")) == Path("/ckpt/abc:train:0/sampler_weights/step-10")


@pytest.mark.parametrize("name", ["", "a/b", "..", ".hidden", "x" * 129, "sp ace"])
def test_unsafe_names_are_refused(name: str) -> None:
    with pytest.raises(UserError) as info:
        checkpoint_path("m:train:0", "weights", name)
    assert info.value.field == "path"


@pytest.mark.parametrize("uri", ["s3://x/weights/a", "tinker://m/weights", "tinker://m/bogus/a",
                                 "tinker:///weights/a", "tinker://m/weights/a/b"])
def test_malformed_uris_are_refused(uri: str) -> None:
    with pytest.raises(UserError):
        parse_tinker_path(uri, field="model_path")
