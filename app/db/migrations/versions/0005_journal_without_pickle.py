"""Journal without pickle: the operations that releases up to revision 0004 stored pickled are rewritten in the
versioned encoding (app.db.journal_codec). They are read by an unpickler that builds only records, numpy arrays
and plain values: a row naming any other class stops the migration, and nothing a row says is ever run.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-27 00:30:00.000000
"""

from __future__ import annotations

import importlib
import io
import pickle
from typing import Any

import sqlalchemy as sa
from alembic import op

from app.db.journal_codec import RECORD_TYPES, Record, encode_tree

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_RECORD_MODULES = (
    "app.messages",
    "app.training.batch",
    "app.db.checkpoints",
    "app.storage.paths",
    "app.training.custom_loss.program",
)
_NUMPY = {  # what pickle rebuilds a numpy array or scalar with (numpy 1 names, numpy 2 names)
    (module, name)
    for package in ("numpy.core", "numpy._core")
    for module, name in (
        (f"{package}.numeric", "_frombuffer"),
        (f"{package}.multiarray", "_reconstruct"),
        (f"{package}.multiarray", "scalar"),
    )
} | {("numpy", "dtype"), ("numpy", "ndarray")}


class _Pickled:
    """A pickled record, as its class name and the state pickle restores."""

    name = ""

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.state = state


class _RecordsOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module in _RECORD_MODULES and name in RECORD_TYPES:
            return type(name, (_Pickled,), {"name": name})
        if (module, name) in _NUMPY:
            return getattr(importlib.import_module(module.replace("numpy.core", "numpy._core")), name)
        raise pickle.UnpicklingError(f"{module}.{name} is not an operation's part")


def _records(value: Any) -> Any:
    if isinstance(value, _Pickled):
        return Record(value.name, {key: _records(item) for key, item in value.state.items()})
    if isinstance(value, tuple):
        return tuple(_records(item) for item in value)
    if isinstance(value, list):
        return [_records(item) for item in value]
    if isinstance(value, dict):
        return {key: _records(item) for key, item in value.items()}
    return value


def upgrade() -> None:
    conn = op.get_bind()
    journal = sa.table("journal", sa.column("model_id"), sa.column("seq_id"), sa.column("op", sa.LargeBinary))
    keys = conn.execute(sa.select(journal.c.model_id, journal.c.seq_id)).all()
    for model_id, seq_id in keys:  # one row at a time: a journaled batch may be tens of MB
        where = (journal.c.model_id == model_id) & (journal.c.seq_id == seq_id)
        blob = conn.execute(sa.select(journal.c.op).where(where)).scalar_one()
        if not blob.startswith(b"\x80"):  # not pickled
            continue
        try:
            tree = _records(_RecordsOnly(io.BytesIO(blob)).load())
        except (pickle.UnpicklingError, ValueError, EOFError) as exc:
            raise RuntimeError(
                f"journal row ({model_id!r}, {seq_id}) cannot be read as a tinker-serve operation ({exc}); "
                "delete that row (the model is then rebuilt without it) or restore a backup, and start again"
            ) from exc
        conn.execute(sa.update(journal).where(where).values(op=encode_tree(tree)))


def downgrade() -> None:
    raise NotImplementedError("tinker-serve upgrades in place and does not downgrade: restore a backup instead")
