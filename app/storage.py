"""Checkpoint paths: `tinker://{model_id}/{kind}/{name}` <-> directories under the checkpoint root.

The SDK splits tinker paths after `tinker://` on `/` into exactly three segments, so neither the run id
nor the name may hold `/`; names are also kept to a safe character set.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Iterator

from app.errors import UserError

KINDS = ("weights", "sampler_weights", "external_weights")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_MODEL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_:-]{0,199}$")  # `{session}:train:{n}`; never `.` or `..`


@dataclass(frozen=True)
class CheckpointPath:
    model_id: str
    kind: str
    name: str

    @property
    def uri(self) -> str:
        return f"tinker://{self.model_id}/{self.kind}/{self.name}"

    def directory(self, root: Path) -> Path:
        return root / self.model_id / self.kind / self.name


def checkpoint_path(model_id: str, kind: str, name: str, *, field: str = "path") -> CheckpointPath:
    """A validated checkpoint path for a new save."""
    if kind not in KINDS:
        raise UserError(f"checkpoint kind {kind!r} is not one of {KINDS}", field=field)
    if not _NAME.match(name) or name in (".", ".."):
        raise UserError(f"checkpoint name {name!r} must be 1-128 of letters, digits, '.', '_' or '-' "
                        "and start with a letter or digit", field=field)
    return CheckpointPath(model_id, kind, name)


def parse_tinker_path(uri: str, *, field: str = "path") -> CheckpointPath:
    """Parse `tinker://{model_id}/{kind}/{name}`, with a user error naming `field` when malformed."""
    if not uri.startswith("tinker://"):
        raise UserError(f"{uri!r} is not a tinker:// path", field=field)
    parts = uri[len("tinker://"):].split("/")
    if len(parts) != 3 or not _MODEL_ID.match(parts[0]):
        raise UserError(f"{uri!r} must look like tinker://<model_id>/<kind>/<name>", field=field)
    return checkpoint_path(parts[0], parts[1], parts[2], field=field)


_CHECKPOINT_TYPES = {"weights": "training", "sampler_weights": "sampler", "external_weights": "external"}


@dataclass(frozen=True)
class StoredCheckpoint:
    path: CheckpointPath
    saved_at: float
    size_bytes: int

    def to_json(self) -> dict:
        """The REST `Checkpoint` view."""
        return {"checkpoint_id": f"{self.path.kind}/{self.path.name}",
                "checkpoint_type": _CHECKPOINT_TYPES[self.path.kind],
                "time": datetime.fromtimestamp(self.saved_at, timezone.utc).isoformat(),
                "tinker_path": self.path.uri, "size_bytes": self.size_bytes, "public": False}


def _stored(root: Path, model_id: str) -> Iterator[StoredCheckpoint]:
    """The model's complete checkpoints (temporary build directories are skipped), in no order."""
    for kind in KINDS:
        for directory in (root / model_id / kind).glob("[!.]*"):
            if directory.is_dir():
                files = [f.stat() for f in directory.rglob("*") if f.is_file()]
                yield StoredCheckpoint(CheckpointPath(model_id, kind, directory.name), directory.stat().st_mtime,
                                       sum(f.st_size for f in files))


def _newest_first(checkpoints: Iterable[StoredCheckpoint]) -> list[StoredCheckpoint]:
    return sorted(checkpoints, key=lambda c: c.saved_at, reverse=True)


def list_checkpoints(root: Path, model_id: str) -> list[StoredCheckpoint]:
    """The model's complete checkpoints, newest first. Blocking."""
    return _newest_first(_stored(root, model_id))


def list_all_checkpoints(root: Path) -> list[StoredCheckpoint]:
    """Every run's checkpoints, newest first. Blocking; scans the whole checkpoint root."""
    runs = [d.name for d in root.iterdir() if d.is_dir()] if root.is_dir() else []
    return _newest_first(c for run in runs for c in _stored(root, run))


def delete_checkpoint(root: Path, path: CheckpointPath) -> bool:
    """Remove a checkpoint; it disappears at once (renamed aside, then deleted). False if absent. Blocking."""
    directory = path.directory(root)
    doomed = directory.with_name(f".{directory.name}.deleted-{uuid.uuid4().hex[:8]}")
    try:
        os.rename(directory, doomed)
    except FileNotFoundError:
        return False
    shutil.rmtree(doomed, ignore_errors=True)
    return True
