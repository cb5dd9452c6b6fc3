"""Per-request bounds of the forward_backward codec: checked from declared shapes before anything is allocated.

Peak memory is measured with tracemalloc, which sees numpy's array allocations (np.zeros included).
"""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import pytest
import zstandard
from tinker import types
from tinker.proto import request_conv
from tinker.proto import tinker_public_pb2 as pb

from app.config import LimitsConfig
from app.errors import LimitExceeded, UserError
from app.protocol.codec import decode_forward_backward
from app.training_data.batch import ForwardBackwardInput
from tests.unit.protocol.sdk_wire import legacy_json_input

LIMITS = LimitsConfig()
PROTO, JSON = "application/x-protobuf", "application/json"
MIB = 2**20


def decode(body: bytes, ct: str = PROTO, enc: str | None = None, **bounds: int) -> ForwardBackwardInput:
    """Decode as the ingress does at the default limits (`bounds` overrides the per-request ones)."""
    return decode_forward_backward(body, ct, enc, max_body_bytes=LIMITS.max_request_bytes, **bounds)


@contextmanager
def peak_traced() -> Iterator[list[int]]:
    """Yields a list that holds, once the block is done, the peak bytes traced while it ran."""
    peak: list[int] = []
    tracemalloc.start()
    try:
        yield peak
    finally:
        peak.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()


def datum(n_tokens: int, **inputs: object) -> types.Datum:
    return types.Datum(model_input=types.ModelInput.from_ints([1] * n_tokens), loss_fn_inputs=inputs)


def empty_csr(rows: int, cols: int) -> types.TensorData:
    """An all-zero (rows, cols) float32 tensor as sparse CSR: no values, rows + 1 row pointers."""
    return types.TensorData(
        data=[], dtype="float32", shape=[rows, cols], sparse_crow_indices=[0] * (rows + 1), sparse_col_indices=[]
    )


def proto_msg(data: list[types.Datum]) -> pb.ForwardBackwardRequest:
    fbi = types.ForwardBackwardInput(data=data, loss_fn="cross_entropy")
    req = types.ForwardBackwardRequest(forward_backward_input=fbi, model_id="s:train:0", seq_id=3)
    return request_conv.forward_backward_request_to_proto(req)


def json_obj(data: list[types.Datum]) -> dict:
    fbi = legacy_json_input(data, "cross_entropy", None)
    return {"model_id": "s:train:0", "seq_id": 3, "forward_backward_input": fbi}


def proto_body(data: list[types.Datum]) -> bytes:
    return proto_msg(data).SerializeToString()


def json_body(data: list[types.Datum]) -> bytes:
    return json.dumps(json_obj(data)).encode()


ENCODINGS: list[tuple[str, Callable[[list[types.Datum]], bytes]]] = [(PROTO, proto_body), (JSON, json_body)]


def wide_datums(n: int = 32) -> list[types.Datum]:
    """One-token datums whose weights are an empty CSR of shape [1, 2**26]: 256 MiB each once densified."""
    return [datum(1, target_tokens=[2], weights=empty_csr(1, 2**26)) for _ in range(n)]


def refused_cheaply(body: bytes, ct: str, field: str, limit: str) -> None:
    """Decoding `body` is refused naming `field` and `limits.{limit}`, having allocated under 16 MiB."""
    with peak_traced() as peak, pytest.raises(LimitExceeded) as ei:
        decode(body, ct)
    assert ei.value.field == field
    assert f"limits.{limit}" in str(ei.value)
    assert peak[0] < 16 * MIB


@pytest.mark.parametrize(("ct", "encode"), ENCODINGS)
def test_wide_empty_csr_refused_before_allocating(ct: str, encode: Callable[[list[types.Datum]], bytes]) -> None:
    body = encode(wide_datums())
    if ct == PROTO:
        assert len(body) < 3000  # the 2.7 KB body of the finding
    refused_cheaply(
        body, ct, "data[0].loss_fn_inputs.weights", f"max_sparse_input_width={LIMITS.max_sparse_input_width}"
    )


@pytest.mark.parametrize(("ct", "encode"), ENCODINGS)
def test_cells_are_bounded_per_request_not_per_tensor(ct: str, encode: Callable[[list[types.Datum]], bytes]) -> None:
    """32 datums of 1024 tokens with (1024, 1024) CSR weights: each tensor is small, the request is 2**25 cells
    of weights plus its targets, over the default budget."""
    body = encode([datum(1024, target_tokens=[2] * 1024, weights=empty_csr(1024, 1024)) for _ in range(32)])
    refused_cheaply(body, ct, "data[31].loss_fn_inputs.weights", f"max_loss_input_cells_per_request={2**25}")


@pytest.mark.parametrize(("ct", "encode"), ENCODINGS)
def test_budget_counts_dense_and_sparse_cells(ct: str, encode: Callable[[list[types.Datum]], bytes]) -> None:
    dense = np.ones((2, 5), dtype=np.float32)
    data = [datum(3, target_tokens=[2, 3, 4], weights=empty_csr(3, 5)), datum(2, target_tokens=[5, 6], weights=dense)]
    cells = 3 + 3 * 5 + 2 + 2 * 5
    assert decode(encode(data), ct, max_cells=cells).batch.loss_inputs.keys() == {"target_tokens", "weights"}
    with pytest.raises(LimitExceeded) as ei:
        decode(encode(data), ct, max_cells=cells - 1)
    assert ei.value.field.startswith("data[1].loss_fn_inputs.")
    assert decode(encode(data[:1]), ct, max_sparse_width=5).batch.loss_inputs["weights"].shape == (3, 5)
    with pytest.raises(LimitExceeded, match=r"limits\.max_sparse_input_width=4"):
        decode(encode(data[:1]), ct, max_sparse_width=4)


def test_datum_count_checked_before_any_datum_is_decoded() -> None:
    """One datum over the limit, and that one would fail to decode: the count is what the request hears."""
    data = [datum(1, target_tokens=[2]) for _ in range(LIMITS.max_datums_per_request + 1)]
    msg = proto_msg(data)
    msg.data[-1].model_input.add().image.data = b"png"
    obj = json_obj(data)
    obj["forward_backward_input"]["data"][-1]["model_input"]["chunks"].append({"type": "image", "data": "AAAA"})
    for body, ct in ((msg.SerializeToString(), PROTO), (json.dumps(obj).encode(), JSON)):
        with pytest.raises(LimitExceeded) as ei:
            decode(body, ct)
        assert ei.value.field == "data"
        assert f"limits.max_datums_per_request={LIMITS.max_datums_per_request}" in str(ei.value)
        with pytest.raises(UserError) as later:  # with room for it, the datum's own error
            decode(body, ct, max_datums=len(data))
        assert later.value.field.startswith(f"data[{len(data) - 1}].model_input")


def test_zstd_bomb_is_refused_while_streaming() -> None:
    """A 1 GiB zstd bomb stops at max_request_bytes of output, holding no more than a chunk of it at a time."""
    compressor = zstandard.ZstdCompressor().compressobj()
    zeros = bytes(16 * MIB)
    body = b"".join(compressor.compress(zeros) for _ in range(64)) + compressor.flush()
    del zeros
    assert len(body) < MIB
    with peak_traced() as peak, pytest.raises(LimitExceeded) as ei:
        decode(body, enc="zstd")
    assert ei.value.field == "body"
    assert peak[0] < 16 * MIB
