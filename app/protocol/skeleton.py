"""A forward_backward protobuf body read before it is parsed: its model_id and seq_id alone (for the ownership
check), and every repeated field counted against the count limits (app.protocol.bounds) from the wire.

The header is parsed at C speed by a message type holding only fields 1 and 2 of ForwardBackwardRequest: upb
skips the datums as unknown bytes. The count scan walks the wire format in Python, but only the messages whose
fields the decoder iterates (the request, its datums, their loss_fn_inputs entries and tensors) and never past the
first count over its limit, so its work is bounded by the limits, not by the body. Every message's fields other
than the counted ones (unknown fields, repeated scalars) are bounded by _MAX_OTHER_FIELDS: a body of millions of
tiny unknown fields would otherwise cost the scan what it saves the decoder.
"""

from __future__ import annotations

from collections.abc import Iterator

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError, Message

from app.errors import LimitExceeded, UserError
from app.protocol.bounds import Counter, CountLimits, check_config_entries, check_datum_count
from app.protocol.proto import pb

__all__ = ["read_header", "scan_counts"]

_MAX_OTHER_FIELDS = 64  # per message: the SDK sends each scalar once and no unknown field
_MAX_DIMS = 2  # a loss input is (N,) or (N, K)
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
_LOW_BYTES = bytes(range(0x80))  # the last byte of every varint


def _header_class() -> type[Message]:
    """ForwardBackwardRequest with only model_id (1) and seq_id (2), in a pool of its own."""
    proto = descriptor_pb2.FileDescriptorProto(name="tinker_serve/fb_header.proto", package="tinker_serve")
    proto.syntax = "proto3"
    message = proto.message_type.add(name="ForwardBackwardHeader")
    full = descriptor_pb2.DescriptorProto()
    pb.ForwardBackwardRequest.DESCRIPTOR.CopyToProto(full)
    message.field.extend(f for f in full.field if f.number in (1, 2))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tinker_serve.ForwardBackwardHeader"))


_Header = _header_class()


def _invalid(reason: str) -> UserError:
    return UserError(f"body is not a valid ForwardBackwardRequest protobuf: {reason}", field="body")


def read_header(body: bytes) -> tuple[str, int]:
    """model_id and seq_id of a (decompressed) protobuf body, the rest skipped unread; a UserError if malformed."""
    try:
        header = _Header.FromString(body)
    except DecodeError as exc:
        raise _invalid(str(exc)) from exc
    return header.model_id, int(header.seq_id)


def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while pos < end:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise _invalid("a varint is over 10 bytes")
    raise _invalid("truncated")


def _fields(buf: bytes, start: int, end: int, field: str) -> Iterator[tuple[int, int, int, int]]:
    """(number, wire type, value start, value end) of each field of the message at buf[start:end]."""
    pos = start
    while pos < end:
        key, pos = _varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            value_start, (_, pos) = pos, _varint(buf, pos, end)
        elif wire == _LEN:
            length, value_start = _varint(buf, pos, end)
            pos = value_start + length
        elif wire in (_I64, _I32):
            value_start, pos = pos, pos + (8 if wire == _I64 else 4)
        else:
            raise _invalid(f"{field} has a field of wire type {wire}")
        if pos > end:
            raise _invalid("truncated")
        yield number, wire, value_start, pos


class _Others:
    """The fields of one message that no count limit covers."""

    def __init__(self, field: str) -> None:
        self.field, self.n = field, 0

    def add(self) -> None:
        self.n += 1
        if self.n > _MAX_OTHER_FIELDS:
            raise LimitExceeded(
                f"{self.field} has over {_MAX_OTHER_FIELDS} fields besides its repeated ones (unknown fields, or "
                "scalars sent again)",
                field=self.field,
            )


def _scan_tensor(buf: bytes, start: int, end: int, field: str) -> None:
    others, dims = _Others(field), 0
    for number, wire, a, b in _fields(buf, start, end, field):
        if number == 4 and wire == _LEN:  # packed shape: one varint per byte below 0x80
            dims += (b - a) - len(buf[a:b].translate(None, _LOW_BYTES))
        elif number == 4 and wire == _VARINT:
            dims += 1
        else:
            others.add()
        if dims > _MAX_DIMS:
            message = f"{field} has a shape of over {_MAX_DIMS} dimensions; only (N,) or (N, K) is supported"
            raise LimitExceeded(message, field=field)


def _scan_entry(buf: bytes, start: int, end: int, field: str) -> None:
    """A loss_fn_inputs entry: its key (1) names the tensor (2) in errors."""
    entry, values = _Others(field), []
    key = ""
    for number, wire, a, b in _fields(buf, start, end, field):
        entry.add()
        if number == 1 and wire == _LEN:
            key = buf[a:b].decode("utf-8", "replace")
        elif number == 2 and wire == _LEN:
            values.append((a, b))
    for a, b in values:
        _scan_tensor(buf, a, b, f"{field}.{key}")


def _scan_datum(buf: bytes, start: int, end: int, i: int, counter: Counter) -> None:
    field = f"data[{i}]"
    others = _Others(field)
    counter.next_datum()
    for number, wire, a, b in _fields(buf, start, end, field):
        if wire != _LEN:
            others.add()
        elif number == 1:
            counter.add_chunks(i)
        elif number == 2:
            counter.add_inputs(i)
            _scan_entry(buf, a, b, f"{field}.loss_fn_inputs")
        elif number in (3, 4):
            counter.add_spans(f"{field}.{'model_input_spans' if number == 3 else 'loss_fn_input_spans'}")
        else:
            others.add()


def scan_counts(body: bytes, max_datums: int, limits: CountLimits) -> None:
    """Refuse a (decompressed) protobuf body whose datums, chunks, loss inputs, config entries, spans or tensor
    dimensions exceed their limits, before it is parsed; malformed wire data is a UserError too."""
    others, counter, datums, config = _Others("body"), Counter(limits), 0, 0
    for number, wire, a, b in _fields(body, 0, len(body), "body"):
        if number == 3 and wire == _LEN:
            check_datum_count(datums + 1, max_datums)
            _scan_datum(body, a, b, datums, counter)
            datums += 1
        elif number in (5, 7) and wire == _LEN:
            config += 1
            check_config_entries(config, limits)
        else:
            others.add()
