"""Checkpoint paths: `tinker://{model_id}/{kind}/{name}`, validated.

The SDK splits tinker paths after `tinker://` on `/` into exactly three segments, so neither the run id
nor the name may hold `/`; both are kept to safe character sets, so no path built from them can escape
the storage root (no `..`, no absolute paths, bounded length).
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

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

    @property
    def checkpoint_id(self) -> str:
        """The REST id: `{kind}/{name}`."""
        return f"{self.kind}/{self.name}"

    def new_location(self) -> str:
        """A fresh storage location for a save of this checkpoint (locations are written once)."""
        return f"{self.model_id}/{self.kind}/{self.name}/{uuid.uuid4().hex[:12]}"


def checkpoint_path(model_id: str, kind: str, name: str, *, field: str = "path") -> CheckpointPath:
    """A validated checkpoint path for a new save."""
    if kind not in KINDS:
        raise UserError(f"checkpoint kind {kind!r} is not one of {KINDS}", field=field)
    if not _NAME.match(name) or name in (".", ".."):
        raise UserError(
            f"checkpoint name {name!r} must be 1-128 of letters, digits, '.', '_' or '-' "
            "and start with a letter or digit",
            field=field,
        )
    return CheckpointPath(model_id, kind, name)


def parse_tinker_path(uri: str, *, field: str = "path") -> CheckpointPath:
    """Parse `tinker://{model_id}/{kind}/{name}`, with a user error naming `field` when malformed."""
    if not uri.startswith("tinker://"):
        raise UserError(f"{uri!r} is not a tinker:// path", field=field)
    parts = uri[len("tinker://") :].split("/")
    if len(parts) != 3 or not _MODEL_ID.match(parts[0]):
        raise UserError(f"{uri!r} must look like tinker://<model_id>/<kind>/<name>", field=field)
    return checkpoint_path(parts[0], parts[1], parts[2], field=field)


def snapshot_location(model_id: str, seq_id: int) -> str:
    """Where a live model's snapshot after `seq_id` is stored (beside its checkpoints, under its run id)."""
    return f"{model_id}/snapshots/{seq_id:012d}"
