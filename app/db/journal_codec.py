"""How the journal stores an operation (app.messages): a versioned msgpack encoding that names each record's type and
fields, so that any release can read what an earlier one wrote and reading a row never runs code.

A blob is `MAGIC`, one format byte, then msgpack. Records (the dataclasses in `RECORD_TYPES`) are stored by their
class name and field names: a field a later release adds must have a default (rows written before it get the
default), and a class or field that is renamed or removed keeps an entry in `RENAMED_RECORDS` / is dropped with a
new format byte and its reader here. numpy arrays keep their dtype, shape and bytes; tuples stay tuples.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from app.db.checkpoints import CheckpointRecord
from app.messages import (
    AdamParams,
    AdapterSpec,
    DimuonParams,
    ForwardBackwardArgs,
    PassLayout,
    PassMember,
    SequencedOp,
)
from app.operations import OPERATIONS
from app.storage.paths import CheckpointPath
from app.training_data.batch import BatchImage, PackedBatch
from app.training_data.custom_loss_nodes import LossNode
from app.training_data.custom_losses import CustomLossProgram

MAGIC = b"TSJ"
FORMAT = 1  # the format byte this release writes

RECORD_TYPES: dict[str, type] = {  # every operation's message (app.operations), and what they are made of
    cls.__name__: cls
    for cls in (
        AdamParams,
        AdapterSpec,
        BatchImage,
        CheckpointPath,
        CheckpointRecord,
        CustomLossProgram,
        DimuonParams,
        ForwardBackwardArgs,
        LossNode,
        PackedBatch,
        PassLayout,
        PassMember,
        *OPERATIONS,
    )
}
RENAMED_RECORDS: dict[str, str] = {}  # a record's name as an earlier release wrote it -> its name now

_ARRAY, _TUPLE, _RECORD = 1, 2, 3  # msgpack extension codes: the markers leading a list


class JournalFormatError(ValueError):
    """A journal row this release cannot read (written by a newer release, or not by tinker-serve at all)."""


@dataclass(frozen=True)
class Record:
    """A record by name and fields: what a dataclass in `RECORD_TYPES` is stored as (and what migrations build)."""

    name: str
    fields: dict[str, Any]


def encode(op: SequencedOp) -> bytes:
    """The journal blob of an operation."""
    return encode_tree(op)


def encode_tree(value: Any) -> bytes:
    """The blob of any value made of records (dataclasses of `RECORD_TYPES` or `Record`s), numpy arrays, tuples,
    lists, dicts with string keys, strings, bytes, numbers, booleans and None."""
    return MAGIC + bytes([FORMAT]) + _pack(value)


def decode(blob: bytes) -> SequencedOp:
    """The operation a journal blob holds."""
    op = decode_tree(blob)
    if not isinstance(op, SequencedOp):
        raise JournalFormatError(f"a journal entry holds a {type(op).__name__}, not an operation")
    return op


def decode_tree(blob: bytes) -> Any:
    """The value a blob of `encode_tree` holds."""
    if blob[: len(MAGIC)] != MAGIC or len(blob) <= len(MAGIC):
        raise JournalFormatError("not a tinker-serve journal entry (unknown header)")
    version = blob[len(MAGIC)]
    if version != FORMAT:
        raise JournalFormatError(
            f"journal entry in format {version}; this release reads format {FORMAT}: use the release that wrote it"
        )
    return _unpack(blob[len(MAGIC) + 1 :])


def _pack(value: Any) -> bytes:
    return msgpack.packb(value, default=_default, use_bin_type=True, strict_types=True)


# A record, tuple or array is a msgpack list led by an extension marker (its data: the record's name), so arrays'
# bytes are copied once into the blob however deep they sit.
def _default(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise TypeError("arrays of Python objects are not journaled")
        return [msgpack.ExtType(_ARRAY, b""), value.dtype.str, list(value.shape), np.ascontiguousarray(value).data]
    if isinstance(value, tuple):
        return [msgpack.ExtType(_TUPLE, b""), *value]
    if isinstance(value, Record):
        return [msgpack.ExtType(_RECORD, value.name.encode()), value.fields]
    if dataclasses.is_dataclass(value) and RECORD_TYPES.get(type(value).__name__) is type(value):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return [msgpack.ExtType(_RECORD, type(value).__name__.encode()), fields]
    if isinstance(value, np.generic):  # numpy scalars as Python's
        return value.item()
    if isinstance(value, str):  # a StrEnum as its value
        return str(value)
    raise TypeError(f"{type(value).__name__} is not journaled")


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, ext_hook=msgpack.ExtType, list_hook=_list, raw=False)


def _list(items: list[Any]) -> Any:
    """A decoded list, or the record, tuple or array it stands for (lists are decoded innermost first)."""
    marker = items[0] if items else None
    if not isinstance(marker, msgpack.ExtType):
        return items
    if marker.code == _ARRAY:
        _, dtype, shape, raw = items
        return np.frombuffer(raw, dtype=np.dtype(dtype)).reshape(shape).copy()
    if marker.code == _TUPLE:
        return tuple(items[1:])
    if marker.code == _RECORD:
        name = marker.data.decode()
        return _record(RENAMED_RECORDS.get(name, name), items[1])
    raise JournalFormatError(f"unknown extension {marker.code} in a journal entry")


def _record(name: str, fields: dict[str, Any]) -> Any:
    cls = RECORD_TYPES.get(name)
    if cls is None:
        raise JournalFormatError(f"a journal entry holds a {name!r}, which this release does not know")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise JournalFormatError(f"a journal entry's {name} has fields this release does not know: {unknown}")
    try:
        return cls(**fields)
    except TypeError as exc:  # a field without a default is missing
        raise JournalFormatError(f"a journal entry's {name} cannot be read: {exc}") from None
