"""Image chunks that point at a location (the SDK's ImageAssetPointerChunk), read into the bytes an image chunk
carries. The server fetches nothing from the network: a pointer may name only what the operator allows
(`images.asset_roots`), a file in a local directory (an absolute path or a file:// URL) or an object under an object
store prefix (s3:// or gs://, read through pyarrow.fs as the checkpoint store is, with the server's credentials).

`locate` resolves a location first (a local path's symlinks and `..`, an object key's `..`) and refuses one outside
every root with the same words whether anything is there or not; `read` then reads at most limits.max_image_bytes + 1
bytes of it and checks its header against the chunk's format and the image limits (app.images.checks). Both block:
callers run them off the event loop (a forward(_backward)'s decoding process, a thread for a sample's prompt).
"""

from __future__ import annotations

import functools
import logging
import os
import posixpath
import stat
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from app.config import ImagesConfig, LimitsConfig
from app.config_sections import ASSET_STORE_SCHEMES
from app.errors import LimitExceeded, UserError
from app.images.checks import ImageLimits, check_image

if TYPE_CHECKING:
    import pyarrow.fs as pafs

logger = logging.getLogger("tinker_serve.images")
MAX_LOCATION_CHARS = 4096  # PATH_MAX: no local path is longer
_ROOTS = "images.asset_roots"
_LIMITS = ImageLimits.of(LimitsConfig())


@dataclass(frozen=True)
class Located:
    """Where a pointer's image lies: a root of `images.asset_roots` and, inside it, the resolved local path or the
    object store path (`bucket/key`)."""

    root: str
    path: str
    local: bool


def _refused(field: str, why: str) -> UserError:
    return UserError(f"{field}.location {why}", field=f"{field}.location")


@dataclass(frozen=True)
class ImageAssets:
    """The operator's image asset roots and the image limits a pointed file is read under. Plain values, so it
    travels to the decoding processes; object stores are opened once per process (`_object_store`)."""

    roots: tuple[str, ...] = ()
    limits: ImageLimits = _LIMITS

    @classmethod
    def of(cls, images: ImagesConfig, limits: LimitsConfig) -> ImageAssets:
        return cls(tuple(images.asset_roots), ImageLimits.of(limits))

    def locate(self, field: str, location: str) -> Located:
        """Where the location of the pointer chunk at `field` lies inside a root; a UserError naming
        `{field}.location` when it is not a form served here or lies outside every root."""
        scheme = urlsplit(location).scheme.lower() if "://" in location else ""
        if scheme in ("http", "https"):
            raise _refused(
                field,
                f"is an {scheme} URL: this server fetches nothing from the network; send the image's bytes "
                "in an image chunk",
            )
        if not self.roots:
            raise _refused(
                field,
                f"cannot be read: this server has no image asset roots ({_ROOTS} is empty; its operator lists "
                "the directories and object store prefixes pointers may name there); send the image's bytes in an "
                "image chunk",
            )
        if len(location) > MAX_LOCATION_CHARS:
            raise _refused(field, f"is longer than {MAX_LOCATION_CHARS} characters")
        if scheme in ASSET_STORE_SCHEMES:
            located = self._locate_object(field, scheme, location)
        elif scheme in ("", "file"):
            located = self._locate_local(field, location)
        else:
            located = None
        if located is None:
            raise _refused(field, f"is not inside this server's image asset roots ({_ROOTS})")
        return located

    def _locate_local(self, field: str, location: str) -> Located | None:
        parts = urlsplit(location)
        if parts.scheme:
            if parts.netloc not in ("", "localhost") or parts.query or parts.fragment:
                raise _refused(field, "must be a file:///absolute/path URL (no host, query or fragment)")
            path = unquote(parts.path)
        else:
            path = location
        if not path.startswith("/"):
            raise _refused(field, f"must be an absolute path, a file:// URL or an {_store_forms()} URL")
        try:
            real = os.path.realpath(path)  # symlinks and `..` resolved before the check: nothing outside is opened
        except ValueError as exc:  # a NUL byte
            raise _refused(field, "is not a valid path") from exc
        for root in self.roots:
            if "://" in root and not root.startswith("file://"):
                continue
            inside = os.path.realpath(unquote(urlsplit(root).path) if root.startswith("file://") else root)
            if real.startswith(inside.rstrip("/") + "/"):
                return Located(root, real, local=True)
        return None

    def _locate_object(self, field: str, scheme: str, location: str) -> Located | None:
        parts = urlsplit(location)
        if not parts.netloc or parts.query or parts.fragment:
            raise _refused(field, f"must be an {scheme}://bucket/key URL (no query or fragment)")
        path = posixpath.normpath(f"/{parts.netloc}/{parts.path}").lstrip("/")  # a key's `..` resolved, as local
        for root in self.roots:
            if root.startswith(f"{scheme}://") and path.startswith(_store_path(root) + "/"):
                return Located(root, path, local=False)
        return None

    def read(self, field: str, located: Located, declared_format: str) -> bytes:
        """The bytes of a located image, at most limits.max_image_bytes + 1 of them read; a UserError naming
        `{field}.location` when nothing readable is there, it is too large, or its header is not an image of the
        chunk's `format` within the image limits."""
        most = self.limits.max_image_bytes
        data = _read_local(field, located.path, most) if located.local else _read_object(field, located, most)
        check_image(field, data, declared_format, self.limits, source="location")
        return data


NO_ASSETS = ImageAssets()  # no roots: every pointer is refused, naming images.asset_roots


def _store_forms() -> str:
    return " or ".join(f"{scheme}://" for scheme in ASSET_STORE_SCHEMES)


def _store_path(root: str) -> str:
    """An object store root's `bucket/prefix` (its query configures the filesystem only)."""
    parts = urlsplit(root)
    return f"{parts.netloc}{parts.path}".rstrip("/")


def _too_large(field: str, size: str, most: int) -> LimitExceeded:
    return LimitExceeded(
        f"{field}.location names a file of {size} bytes, over {most} (limits.max_image_bytes)",
        field=f"{field}.location",
    )


def _read_local(field: str, path: str, most: int) -> bytes:
    try:  # the path is resolved: a symlink put there since is not followed; a FIFO does not block the open
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise _refused(field, "names no file: nothing is there") from exc
    except OSError as exc:
        raise _refused(field, f"names a file this server cannot read ({exc.strerror})") from exc
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise _refused(field, "names a directory or a device, not an image file")
        if info.st_size > most:
            raise _too_large(field, str(info.st_size), most)
        data = file.read(most + 1)
    if len(data) > most:  # grown since
        raise _too_large(field, f"over {most}", most)
    return data


@functools.lru_cache(maxsize=16)
def _object_store(root: str) -> pafs.FileSystem:
    """The filesystem of an object store root (opened once per process: it resolves credentials)."""
    import pyarrow.fs as pafs  # only object store roots need it

    filesystem, _ = pafs.FileSystem.from_uri(root)
    return filesystem


def _read_object(field: str, located: Located, most: int) -> bytes:
    import pyarrow.fs as pafs

    try:
        filesystem = _object_store(located.root)
        info = filesystem.get_file_info(located.path)
        if info.type == pafs.FileType.NotFound:
            raise _refused(field, "names no object: nothing is there")
        if info.type != pafs.FileType.File:
            raise _refused(field, "names a prefix, not an image object")
        if info.size is not None and info.size > most:
            raise _too_large(field, str(info.size), most)
        with filesystem.open_input_stream(located.path) as stream:
            data = stream.read(most + 1)
    except OSError as exc:
        logger.warning("reading image asset %s failed: %s", located.path, exc)
        raise _refused(field, "names an object this server cannot read") from exc
    if len(data) > most:
        raise _too_large(field, f"over {most}", most)
    return data
