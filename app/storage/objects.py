"""Checkpoint files on any `pyarrow.fs` filesystem: a local directory by default; `s3://`, `gs://`, `hdfs://`
URIs by config on clusters (credentials from the usual environment variables, never from config).

Files live at *locations*, keys under the storage root written once and never changed (a new save gets a
new location), so readers may cache a location's files forever. A location appears complete or not at all:
on local storage it is built in a hidden sibling directory and renamed into place; on object stores it is
uploaded first, and the checkpoint row written afterwards is what makes it visible.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import pyarrow.fs as pafs

_CHUNK = 1 << 20


@dataclass(frozen=True, order=True)
class StoredFile:
    relative_path: str
    size_bytes: int


def _directory_size(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())


def _check_location(location: str) -> str:
    parts = location.split("/")
    if not location or location.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"storage location {location!r} must be a relative path without '.' or '..' segments")
    return location


class ObjectStorage:
    """One storage root: `uri` is an absolute local path or a filesystem URI pyarrow understands. Blocking."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self._fs, root = pafs.FileSystem.from_uri(uri)
        self._root = root.rstrip("/")
        self.is_local = isinstance(self._fs, pafs.LocalFileSystem)

    def _full(self, location: str) -> str:
        return f"{self._root}/{_check_location(location)}"

    def write(self, location: str, build: Callable[[Path], None]) -> int:
        """Build a directory with `build(out)` and store it at `location`; returns its size in bytes."""
        if self.is_local:
            target = Path(self._full(location))
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}.") as tmp:
                staged = Path(tmp) / "out"
                build(staged)
                size = _directory_size(staged)
                if target.exists():  # a retried write of the same location: the new copy wins
                    os.rename(target, Path(tmp) / "replaced")
                os.rename(staged, target)
            return size
        with tempfile.TemporaryDirectory(prefix="tinker-serve-upload-") as tmp:
            staged = Path(tmp) / "out"
            build(staged)
            pafs.copy_files(
                str(staged),
                self._full(location),
                source_filesystem=pafs.LocalFileSystem(),
                destination_filesystem=self._fs,
                chunk_size=_CHUNK,
            )
            return _directory_size(staged)

    def files(self, location: str) -> list[StoredFile]:
        """The location's files, sorted; FileNotFoundError when it holds none."""
        base = self._full(location)
        try:
            infos = self._fs.get_file_info(pafs.FileSelector(base, recursive=True))
        except FileNotFoundError:
            infos = []
        found = sorted(StoredFile(i.path[len(base) + 1 :], i.size) for i in infos if i.type == pafs.FileType.File)
        if not found:
            raise FileNotFoundError(f"nothing stored at {location!r}")
        return found

    def fetch(self, location: str, cache_root: Path) -> Path:
        """A local directory with the location's files: the location itself on local storage, else a copy under
        `cache_root` (downloaded once, as locations never change). FileNotFoundError when absent."""
        if self.is_local:
            path = Path(self._full(location))
            if not path.is_dir():
                raise FileNotFoundError(f"nothing stored at {location!r}")
            return path
        target = cache_root / _check_location(location)
        if target.is_dir():
            return target
        staged = target.parent / f".{target.name}.{uuid.uuid4().hex[:8]}"
        staged.mkdir(parents=True)  # copy_files creates the subdirectories only
        try:
            pafs.copy_files(
                self._full(location),
                str(staged),
                source_filesystem=self._fs,
                destination_filesystem=pafs.LocalFileSystem(),
                chunk_size=_CHUNK,
            )
            os.rename(staged, target)
        except OSError:
            if not target.is_dir():  # else another reader fetched it first
                raise
        finally:
            shutil.rmtree(staged, ignore_errors=True)
        return target

    def copy(self, source: str, target: str) -> int:
        """Store a copy of the files at `source` at the new location `target` (appearing complete or not at all,
        as `write` does); returns its size in bytes. FileNotFoundError when `source` holds nothing."""
        files = self.files(source)
        if self.is_local:
            origin = self._full(source)

            def build(out: Path) -> None:
                shutil.copytree(origin, out)

            return self.write(target, build)
        pafs.copy_files(
            self._full(source),
            self._full(target),
            source_filesystem=self._fs,
            destination_filesystem=self._fs,
            chunk_size=_CHUNK,
        )
        return sum(f.size_bytes for f in files)

    def open(self, location: str, relative_path: str) -> pafs.NativeFile:
        """A stream over one file of a location (read it in chunks; never whole)."""
        return self._fs.open_input_stream(f"{self._full(location)}/{_check_location(relative_path)}")

    def create(self, location: str, relative_path: str) -> pafs.NativeFile:
        """A stream writing one file of a location (replacing it), its parent directories made."""
        path = f"{self._full(location)}/{_check_location(relative_path)}"
        self._fs.create_dir(path.rpartition("/")[0], recursive=True)
        return self._fs.open_output_stream(path)

    def rename(self, location: str, source: str, target: str) -> None:
        """Rename one file of a location (replacing `target`)."""
        full = self._full(location)
        self._fs.move(f"{full}/{_check_location(source)}", f"{full}/{_check_location(target)}")

    def presigned_put(self, location: str, relative_path: str, content_type: str | None, ttl_s: int) -> str | None:
        """A URL that lets its holder PUT one file of a location straight to an S3 store for `ttl_s`, sending
        `content_type` (signed with it; None: any); None on other storage (the caller offers a route of its own)."""
        if not isinstance(self._fs, pafs.S3FileSystem):
            return None
        import boto3  # type: ignore[import-untyped]  # only S3 storage needs it

        query = dict(parse_qsl(urlsplit(self.uri).query))
        endpoint = query.get("endpoint_override")
        client = boto3.client(
            "s3",
            endpoint_url=None if endpoint is None else f"{query.get('scheme', 'https')}://{endpoint}",
            region_name=query.get("region") or None,
        )
        bucket, _, prefix = self._full(location).partition("/")
        params = {"Bucket": bucket, "Key": f"{prefix}/{_check_location(relative_path)}"}
        if content_type is not None:
            params["ContentType"] = content_type
        url: str = client.generate_presigned_url("put_object", Params=params, ExpiresIn=ttl_s, HttpMethod="PUT")
        return url

    def delete(self, location: str) -> None:
        """Remove a location's files; absent ones are ignored. Local locations vanish at once (renamed aside)."""
        if self.is_local:
            target = Path(self._full(location))
            doomed = target.with_name(f".{target.name}.deleted-{uuid.uuid4().hex[:8]}")
            try:
                os.rename(target, doomed)
            except FileNotFoundError:
                return
            shutil.rmtree(doomed, ignore_errors=True)
            return
        with contextlib.suppress(FileNotFoundError):
            self._fs.delete_dir(self._full(location))
