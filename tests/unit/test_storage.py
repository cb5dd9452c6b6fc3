"""Checkpoint path formatting and parsing, and the directory each path maps to."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.errors import UserError
from app.storage import checkpoint_path, delete_checkpoint, list_checkpoints, parse_tinker_path


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
                                 "tinker:///weights/a", "tinker://m/weights/a/b", "tinker://../weights/a",
                                 "tinker://./weights/a", "tinker://m.x/weights/a", "tinker://%2E%2E/weights/a"])
def test_malformed_uris_are_refused(uri: str) -> None:
    with pytest.raises(UserError):
        parse_tinker_path(uri, field="model_path")


def test_list_and_delete_checkpoints(tmp_path: Path) -> None:
    older = checkpoint_path("m:train:0", "weights", "c1")
    newer = checkpoint_path("m:train:0", "sampler_weights", "s1")
    for i, path in enumerate((older, newer)):
        directory = path.directory(tmp_path)
        directory.mkdir(parents=True)
        (directory / "adapter_model.safetensors").write_bytes(b"x" * (10 + i))
        os.utime(directory, (1000 + i, 1000 + i))
    (tmp_path / "m:train:0" / "weights" / ".c2.tmp123").mkdir()  # a save in progress is not listed
    listed = list_checkpoints(tmp_path, "m:train:0")
    assert [(c.path, c.size_bytes) for c in listed] == [(newer, 11), (older, 10)]
    assert listed[0].to_json()["checkpoint_id"] == "sampler_weights/s1"
    assert listed[1].to_json()["checkpoint_type"] == "training"
    assert delete_checkpoint(tmp_path, older) is True
    assert delete_checkpoint(tmp_path, older) is False
    assert [c.path for c in list_checkpoints(tmp_path, "m:train:0")] == [newer]
    assert sorted(p.name for p in (tmp_path / "m:train:0" / "weights").iterdir()) == [".c2.tmp123"]
    assert list_checkpoints(tmp_path, "unknown:train:0") == []
