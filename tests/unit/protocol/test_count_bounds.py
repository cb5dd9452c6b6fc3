"""Every count a forward_backward body carries is refused past its limit before anything is built from it (issue 45
#1, #6): chunks per datum and per request, loss_fn_inputs entries, loss_fn_config entries, provenance spans,
distinct sequence ids, tensor dimensions and unknown fields; protobuf (from the wire, before it is parsed) and JSON.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

import pytest
import zstandard

from app.config import LimitsConfig
from app.errors import LimitExceeded
from app.protocol.bounds import CountLimits
from app.protocol.codec import decode_forward_backward
from app.protocol.proto import pb
from app.training_data.batch import ForwardBackwardInput

PROTO, JSON = "application/x-protobuf", "application/json"
COUNTS = CountLimits.of(LimitsConfig())
SMALL = dataclasses.replace(
    COUNTS,
    max_chunks_per_datum=4,
    max_chunks_per_request=6,
    max_loss_fn_inputs_per_datum=3,
    max_loss_fn_config_entries=2,
    max_provenance_spans_per_request=8,
    max_distinct_sequence_ids_per_request=2,
)


def decode(body: bytes, ct: str = PROTO, enc: str | None = None, counts: CountLimits = SMALL) -> ForwardBackwardInput:
    return decode_forward_backward(body, ct, enc, max_body_bytes=LimitsConfig().max_request_bytes, counts=counts)


def proto_datum(chunks: int = 1, inputs: int = 1, spans: list[str] | None = None) -> pb.Datum:
    """A datum of `chunks` one-token chunks, `inputs` loss inputs and, when given, one sampled span per id on each
    side (tiling is the stable_reinforce validator's business, not the codec's)."""
    d = pb.Datum()
    for _ in range(chunks):
        d.model_input.add().encoded_text.tokens = b"\x01\x00\x00\x00"
    for k in range(inputs):
        name = "target_tokens" if k == 0 else f"extra{k}"
        t = d.loss_fn_inputs[name]
        t.dtype, t.dense = pb.DTYPE_INT64, b"\x00" * 8 * chunks
    for sid in spans or ():
        d.model_input_spans.add().sampled_tokens.sequence_id = sid
        d.loss_fn_input_spans.add().sampled_tokens.sequence_id = sid
    return d


def proto_body(*datums: pb.Datum, config: int = 0) -> bytes:
    req = pb.ForwardBackwardRequest(model_id="m", seq_id=1, loss_fn="cross_entropy")
    req.data.extend(datums)
    for k in range(config):
        req.loss_fn_config[f"k{k}"] = 1.0
    return req.SerializeToString()


def json_datum(chunks: int = 1, inputs: int = 1, spans: list[str] | None = None) -> dict[str, Any]:
    d: dict[str, Any] = {
        "model_input": {"chunks": [{"type": "encoded_text", "tokens": [1]} for _ in range(chunks)]},
        "loss_fn_inputs": {
            ("target_tokens" if k == 0 else f"extra{k}"): {"data": [0] * chunks, "dtype": "int64"}
            for k in range(inputs)
        },
    }
    if spans is not None:
        span = [{"sampled_tokens": {"sequence_id": sid, "length": 1}} for sid in spans]
        d["model_input_spans"], d["loss_fn_input_spans"] = span, span
    return d


def json_body(*datums: dict[str, Any], config: int = 0) -> bytes:
    inner = {"data": list(datums), "loss_fn": "cross_entropy", "loss_fn_config": {f"k{k}": 1.0 for k in range(config)}}
    return json.dumps({"model_id": "m", "seq_id": 1, "forward_backward_input": inner}).encode()


CASES = [  # (name, datums' kwargs, config entries, field, limit's name)
    ("chunks per datum", [{"chunks": 5}], 0, "data[0].model_input.chunks", "max_chunks_per_datum"),
    ("chunks per request", [{"chunks": 4}, {"chunks": 3}], 0, "data[1].model_input.chunks", "max_chunks_per_request"),
    ("loss inputs", [{"inputs": 4}], 0, "data[0].loss_fn_inputs", "max_loss_fn_inputs_per_datum"),
    ("config entries", [{}], 3, "loss_fn_config", "max_loss_fn_config_entries"),
    ("spans", [{"spans": ["a", "a"]}, {"spans": ["a", "a", "a"]}], 0, "data[1].", "max_provenance_spans_per_request"),
    ("distinct ids", [{"spans": ["a", "b", "a", "c"]}], 0, "data[0].model_input_spans[3]", "max_distinct_sequence_ids"),
]


@pytest.mark.parametrize("ct", [PROTO, JSON])
@pytest.mark.parametrize(("name", "datums", "config", "field", "limit"), CASES, ids=[c[0] for c in CASES])
def test_each_count_is_refused_naming_its_field_and_limit(
    ct: str, name: str, datums: list[dict[str, Any]], config: int, field: str, limit: str
) -> None:
    if ct == PROTO:
        body = proto_body(*(proto_datum(**d) for d in datums), config=config)
    else:
        body = json_body(*(json_datum(**d) for d in datums), config=config)
    with pytest.raises(LimitExceeded) as ei:
        decode(body, ct)
    assert ei.value.field is not None and ei.value.field.startswith(field), (ei.value.field, ei.value.message)
    assert f"limits.{limit}" in ei.value.message


@pytest.mark.parametrize("ct", [PROTO, JSON])
def test_counts_at_their_limits_decode(ct: str) -> None:
    datums = [{"chunks": 4, "inputs": 3, "spans": ["a", "b"]}, {"chunks": 2, "inputs": 3}]
    if ct == PROTO:
        body = proto_body(*(proto_datum(**d) for d in datums), config=2)
    else:
        body = json_body(*(json_datum(**d) for d in datums), config=2)
    decoded = decode(body, ct, counts=dataclasses.replace(SMALL, max_provenance_spans_per_request=4))
    assert decoded.batch.num_datums == 2 and len(decoded.batch.tokens) == 6


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


def test_millions_of_empty_chunks_are_refused_from_the_wire_in_well_under_a_second() -> None:
    """Issue 45 #1: one datum of 16M empty encoded_text chunks (64 MB, 5 KB as zstd) took 29 s of CPU and 3.7 GB
    to decode on 6cc7317; the chunk count is refused from the wire before the message is parsed."""
    datum = b"\x0a\x02\x0a\x00" * 16_000_000
    plain = proto_body() + b"\x1a" + _varint(len(datum)) + datum
    body = zstandard.ZstdCompressor(level=19).compress(plain)
    assert len(body) < 8192
    started = time.process_time()
    with pytest.raises(LimitExceeded) as ei:
        decode(body, enc="zstd", counts=COUNTS)
    assert time.process_time() - started < 1.0
    assert ei.value.field == "data[0].model_input.chunks"
    assert "limits.max_chunks_per_datum=65536" in ei.value.message


def test_unknown_fields_and_deep_shapes_are_bounded_on_the_wire() -> None:
    """Fields no count covers (unknown ones, scalars sent again) and a tensor's dimensions: the scan walks every
    field of the messages the decoder iterates, so these are bounded too."""
    unknown = b"\xf8\x07\x00" * 1000  # field 127, varint 0
    with pytest.raises(LimitExceeded) as ei:
        decode(proto_body(proto_datum()) + unknown, counts=COUNTS)
    assert ei.value.field == "body"
    d = proto_datum()
    d.loss_fn_inputs["target_tokens"].shape.extend([1] * 1_000_000)
    with pytest.raises(LimitExceeded) as ei:
        decode(proto_body(d), counts=COUNTS)
    assert ei.value.field == "data[0].loss_fn_inputs.target_tokens"
