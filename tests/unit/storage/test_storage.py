"""Checkpoint paths (validation, traversal) and object storage: the same behaviour on a local directory and
on an S3-compatible server on loopback."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.errors import UserError
from app.storage.objects import ObjectStorage, StoredFile
from app.storage.paths import checkpoint_path, parse_tinker_path
from tests.s3 import s3_server


def test_round_trip_and_fresh_locations() -> None:
    path = checkpoint_path("abc:train:0", "sampler_weights", "step-10")
    assert path.uri == "tinker://abc:train:0/sampler_weights/step-10"
    assert path.checkpoint_id == "sampler_weights/step-10"
    assert parse_tinker_path(path.uri) == path
    first, second = path.new_location(), path.new_location()
    assert first.startswith("abc:train:0/sampler_weights/step-10/") and first != second


@pytest.mark.parametrize("name", ["", "a/b", "..", ".hidden", "x" * 129, "sp ace", "/abs", "a\\b", "%2E%2E"])
def test_unsafe_names_are_refused(name: str) -> None:
    with pytest.raises(UserError) as info:
        checkpoint_path("m:train:0", "weights", name)
    assert info.value.field == "path"


@pytest.mark.parametrize(
    "uri",
    [
        "s3://x/weights/a",
        "tinker://m/weights",
        "tinker://m/bogus/a",
        "tinker:///weights/a",
        "tinker://m/weights/a/b",
        "tinker://../weights/a",
        "tinker://./weights/a",
        "tinker://m.x/weights/a",
        "tinker://%2E%2E/weights/a",
        "tinker://m/weights/..",
        "tinker://m/../a",
        "tinker:///etc/passwd",
    ],
)
def test_malformed_uris_are_refused(uri: str) -> None:
    with pytest.raises(UserError) as info:
        parse_tinker_path(uri, field="model_path")
    assert info.value.field == "model_path"


@pytest.fixture(scope="module", params=["local", "s3"])
def storage(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    if request.param == "local":
        yield ObjectStorage(str(tmp_path_factory.mktemp("storage")))
        return
    with s3_server("unit-tests") as uri:
        yield ObjectStorage(uri)


def _build(out: Path) -> None:
    (out / "sub").mkdir(parents=True)
    (out / "adapter_config.json").write_text("{}")
    (out / "sub" / "big.bin").write_bytes(bytes(range(256)) * 8192)  # 2 MiB: several chunks


def _flat(out: Path) -> None:
    out.mkdir()
    (out / "adapter_config.json").write_text("{}")


def test_write_list_fetch_open_delete(storage: ObjectStorage, tmp_path: Path) -> None:
    location = "m:train:0/weights/c1/v1"
    assert storage.write(location, _build) == 2 + 2 * 2**20
    assert storage.files(location) == [StoredFile("adapter_config.json", 2), StoredFile("sub/big.bin", 2 * 2**20)]
    local = storage.fetch(location, tmp_path / "cache")
    assert (local / "sub" / "big.bin").read_bytes() == bytes(range(256)) * 8192
    assert storage.fetch(location, tmp_path / "cache") == local  # fetched once
    with storage.open(location, "sub/big.bin") as stream:
        assert stream.read(10) == bytes(range(10))
    storage.delete(location)
    with pytest.raises(FileNotFoundError):
        storage.files(location)
    with pytest.raises(FileNotFoundError):
        storage.fetch(location, tmp_path / "other-cache")
    storage.delete(location)  # deleting twice is harmless


def test_a_flat_directory_round_trips(storage: ObjectStorage, tmp_path: Path) -> None:
    storage.write("m:train:0/weights/flat/v1", _flat)  # no subdirectory: a PEFT adapter's layout
    assert (storage.fetch("m:train:0/weights/flat/v1", tmp_path / "cache") / "adapter_config.json").read_text() == "{}"


def test_a_failed_build_leaves_nothing(storage: ObjectStorage, tmp_path: Path) -> None:
    def broken(out: Path) -> None:
        out.mkdir()
        (out / "half.bin").write_bytes(b"x")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        storage.write("m:train:0/weights/broken/v1", broken)
    with pytest.raises(FileNotFoundError):
        storage.files("m:train:0/weights/broken/v1")


def test_a_copy_has_files_of_its_own(storage: ObjectStorage, tmp_path: Path) -> None:
    storage.write("m:train:0/weights/src/v1", _build)
    assert storage.copy("m:train:0/weights/src/v1", "n:train:0/weights/src/v2") == 2 + 2 * 2**20
    storage.delete("m:train:0/weights/src/v1")
    assert storage.files("n:train:0/weights/src/v2") == [
        StoredFile("adapter_config.json", 2),
        StoredFile("sub/big.bin", 2 * 2**20),
    ]
    copied = storage.fetch("n:train:0/weights/src/v2", tmp_path / "cache")
    assert (copied / "sub" / "big.bin").read_bytes() == bytes(range(256)) * 8192
    with pytest.raises(FileNotFoundError):
        storage.copy("m:train:0/weights/src/v1", "n:train:0/weights/src/v3")  # the source is gone
    with pytest.raises(FileNotFoundError):
        storage.files("n:train:0/weights/src/v3")


@pytest.mark.parametrize("location", ["../escape", "/abs/path", "a/../../b", "a//b", "", "a/./b"])
def test_locations_cannot_escape_the_root(storage: ObjectStorage, location: str) -> None:
    with pytest.raises(ValueError):
        storage.write(location, _build)
    with pytest.raises(ValueError):
        storage.open("m/weights/c/v1", location or "..")
