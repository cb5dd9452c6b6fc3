"""Property tests of the wire codec against the real tinker 0.38 SDK serialisers (hypothesis-generated requests)."""

from __future__ import annotations

import io
import itertools
import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from tinker import types
from tinker.proto import request_conv, response_conv
from tinker.proto import tinker_public_pb2 as pb
from tinker.types._pydantic_types.tensor_data import TensorData as PydTensorData

from app.errors import LimitExceeded, UserError
from app.protocol.codec import decode_forward_backward, decompress, is_json, valid_sequence
from app.protocol.results import (
    encode_forward_backward_output,
    forward_backward_json_from_proto,
    forward_backward_output_to_json,
)
from app.protocol.skeleton import read_header
from app.training_data.batch import ForwardBackwardInput, ForwardBackwardResult, PackedBatch
from tests.unit.protocol.sdk_wire import legacy_json_input

PROTO = "application/x-protobuf"
JSON = "application/json"
MAX = 1 << 20
SMALL = 1 << 12  # max_body_bytes of the malformed-input properties
FLOAT_KEYS = ("weights", "advantages", "logprobs", "sequence_ratio_mask")
TWO_D_KEYS = frozenset({"target_tokens", "weights"})  # the SDK sends these 2-D as CSR when sparse enough
INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
UTF8_TEXT = st.text(st.characters(codec="utf-8"), max_size=8)

FAST = settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
FUZZ = settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


# ------------------------------------------------------------------------------ request generation


def _to_sdk_value(draw: st.DrawFn, key: str, arr: np.ndarray) -> tuple[Any, np.ndarray]:
    """One loss input in a form the SDK accepts (list, numpy of some dtype, torch, TensorData dense or sparse CSR)
    and the array the server must decode it to (int64 for target_tokens, float32 otherwise)."""
    want = np.int64 if key == "target_tokens" else np.float32
    forms = ["numpy", "torch", "tensordata"] + (["list"] if arr.size or arr.ndim == 1 else [])  # [] loses (0, K)
    form = draw(st.sampled_from(forms + (["csr"] if arr.ndim == 2 else [])))
    if form == "list":
        return arr.tolist(), arr.astype(want)
    if form == "tensordata":
        return types.TensorData.from_numpy(arr.astype(want)), arr.astype(want)
    if form == "csr":  # the SDK keeps it dense unless CSR is smaller
        return types.TensorData.from_torch_sparse(torch.from_numpy(arr.astype(want))), arr.astype(want)
    if form == "numpy":
        dtypes = [np.int32, np.int64] if key == "target_tokens" else [np.float16, np.float32, np.float64]
        cast = arr.astype(draw(st.sampled_from(dtypes)))
        return cast, cast.astype(want)
    dtypes = [torch.int32, torch.int64] if key == "target_tokens" else [torch.float32, torch.float64]
    if key != "target_tokens" and arr.ndim == 1:  # the SDK's CSR path cannot take bfloat16 (values.numpy() fails)
        dtypes.append(torch.bfloat16)
    t = torch.from_numpy(arr).to(draw(st.sampled_from(dtypes)))
    return t, t.to(torch.int64 if key == "target_tokens" else torch.float32).numpy()


def _elements(key: str) -> st.SearchStrategy:
    if key == "target_tokens":
        return INT32  # fits every integer form the SDK takes
    return st.floats(-1e4, 1e4, width=16)  # exact in float16, bfloat16 rounds them: the expected array says how


@st.composite
def sdk_batches(draw: st.DrawFn, max_datums: int = 3, max_len: int = 8) -> tuple[list[types.Datum], PackedBatch]:
    """SDK datums with random tokens (0 to max_len of them) and loss inputs (shared keys and trailing shapes), and
    the batch they encode."""
    keys = draw(st.lists(st.sampled_from(("target_tokens", *FLOAT_KEYS)), unique=True, max_size=4))
    trailing = {k: draw(st.sampled_from([(), (1,), (3,), (8,)])) if k in TWO_D_KEYS else () for k in keys}
    datums, tokens, inputs = [], [], []
    for _ in range(draw(st.integers(1, max_datums))):
        toks = draw(st.lists(st.integers(0, 2**31 - 1), max_size=max_len))
        sdk_inputs, want = {}, {}
        for k in keys:
            arr = draw(
                hnp.arrays(
                    np.int64 if k == "target_tokens" else np.float32,
                    (len(toks), *trailing[k]),
                    elements=_elements(k),
                    fill=st.just(0),
                )
            )
            sdk_inputs[k], want[k] = _to_sdk_value(draw, k, arr)
        datums.append(types.Datum(model_input=types.ModelInput.from_ints(toks), loss_fn_inputs=sdk_inputs))
        tokens.append(np.array(toks, np.int64))
        inputs.append(want)
    offsets = np.concatenate([[0], np.cumsum([len(t) for t in tokens])]).astype(np.int64)
    expected = PackedBatch(np.concatenate(tokens), offsets, {k: np.concatenate([w[k] for w in inputs]) for k in keys})
    return datums, expected


configs = st.dictionaries(UTF8_TEXT, st.floats(allow_nan=False, allow_infinity=False) | UTF8_TEXT, max_size=3)
headers = st.fixed_dictionaries(
    {
        "model_id": UTF8_TEXT.filter(bool),
        "seq_id": st.integers(1, 2**31 - 1),
        "loss_fn": st.sampled_from(["cross_entropy", "ppo", "importance_sampling", "cispo", "dro", "gspo"]),
        "config": configs,
    }
)


def proto_msg(data: list[types.Datum], h: dict[str, Any]) -> pb.ForwardBackwardRequest:
    fbi = types.ForwardBackwardInput(data=data, loss_fn=h["loss_fn"], loss_fn_config=h["config"])
    req = types.ForwardBackwardRequest(forward_backward_input=fbi, model_id=h["model_id"], seq_id=h["seq_id"])
    return request_conv.forward_backward_request_to_proto(req)


def proto_body(data: list[types.Datum], h: dict[str, Any]) -> bytes:
    return proto_msg(data, h).SerializeToString()


def json_body(data: list[types.Datum], h: dict[str, Any], flat: bool = False) -> bytes:
    """The JSON body older SDKs send, built with the SDK's pydantic models (nested or flat)."""
    fbi = legacy_json_input(data, h["loss_fn"], h["config"] or None)
    top = {"model_id": h["model_id"], "seq_id": h["seq_id"]}
    return json.dumps({**top, **fbi} if flat else {**top, "forward_backward_input": fbi}).encode()


def decode(body: bytes, ct: str = PROTO, enc: str | None = None, max_body_bytes: int = MAX) -> ForwardBackwardInput:
    return decode_forward_backward(body, ct, enc, max_body_bytes=max_body_bytes)


def assert_same_batch(got: PackedBatch, want: PackedBatch) -> None:
    assert got.tokens.dtype == np.int64 and got.offsets.dtype == np.int64
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_array_equal(got.offsets, want.offsets)
    assert list(got.loss_inputs) == sorted(want.loss_inputs)
    for k, v in want.loss_inputs.items():
        assert got.loss_inputs[k].dtype == v.dtype, k
        assert got.loss_inputs[k].shape == v.shape, k
        np.testing.assert_array_equal(got.loss_inputs[k], v, err_msg=k)


def assert_same_request(got: ForwardBackwardInput, h: dict[str, Any], want: PackedBatch) -> None:
    assert (got.model_id, got.seq_id, got.loss_fn) == (h["model_id"], h["seq_id"], h["loss_fn"])
    assert got.forward_only is False
    assert got.loss_fn_config == {k: v if isinstance(v, str) else float(v) for k, v in h["config"].items()}
    assert_same_batch(got.batch, want)


# ------------------------------------------------------------------------------------ round trips


@FAST
@given(sdk_batches(), headers, st.booleans())
def test_proto_and_json_round_trips_agree(
    batch: tuple[list[types.Datum], PackedBatch], h: dict[str, Any], flat: bool
) -> None:
    """The SDK's protobuf and JSON encodings of random datums both decode to exactly the datums' batch."""
    data, want = batch
    from_proto = decode(proto_body(data, h))
    from_json = decode(json_body(data, h, flat), ct=f"{JSON}; charset=utf-8")
    assert_same_request(from_proto, h, want)
    assert_same_request(from_json, h, want)


@FAST
@given(sdk_batches(max_datums=2), headers, st.data())
def test_narrow_wire_dtypes_widen(
    batch: tuple[list[types.Datum], PackedBatch], h: dict[str, Any], data: st.DataObject
) -> None:
    """Any dense or CSR tensor re-sent as INT32 (integers) or BFLOAT16 (floats, bits truncated) decodes widened."""
    datums, want = batch
    msg = proto_msg(datums, h)
    expected = dict(want.loss_inputs)
    narrowed = data.draw(st.sets(st.sampled_from(sorted(want.loss_inputs))) if want.loss_inputs else st.just(set()))
    for name in narrowed:
        for d in msg.data:
            t = d.loss_fn_inputs[name]
            sparse = t.WhichOneof("encoding") == "sparse_csr"
            raw = t.sparse_csr.values if sparse else t.dense
            if t.dtype == pb.DTYPE_INT64:
                narrow, t.dtype = np.frombuffer(raw, "<i8").astype("<i4").tobytes(), pb.DTYPE_INT32
            else:
                narrow, t.dtype = (np.frombuffer(raw, "<u4") >> 16).astype("<u2").tobytes(), pb.DTYPE_BFLOAT16
            if sparse:
                t.sparse_csr.values = narrow
            else:
                t.dense = narrow
        if name != "target_tokens":  # int32 holds every generated token exactly; bfloat16 keeps the top 16 bits
            expected[name] = (want.loss_inputs[name].view("<u4") & 0xFFFF0000).view(np.float32)
    assert_same_batch(decode(msg.SerializeToString()).batch, PackedBatch(want.tokens, want.offsets, expected))


# ------------------------------------------------------------------------------------------- zstd


@st.composite
def zstd_frames(draw: st.DrawFn, raw: bytes) -> bytes:
    """One zstd frame of raw: one-shot or streamed in random-size writes with random block flushes."""
    cctx = zstandard.ZstdCompressor(
        level=draw(st.integers(1, 5)), write_checksum=draw(st.booleans()), write_content_size=draw(st.booleans())
    )
    if draw(st.booleans()):
        return cctx.compress(raw)
    out = io.BytesIO()
    with cctx.stream_writer(out, size=len(raw) if draw(st.booleans()) else -1, closefd=False) as writer:
        pos = 0
        while pos < len(raw):
            step = draw(st.integers(1, max(1, len(raw) // 3)))
            writer.write(raw[pos : pos + step])
            pos += step
            if draw(st.booleans()):
                writer.flush(zstandard.FLUSH_BLOCK)
    return out.getvalue()


@FAST
@given(sdk_batches(max_datums=2), headers, st.booleans(), st.sampled_from(["zstd", "ZSTD", " zstd "]), st.data())
def test_zstd_frame_decodes_like_raw_body(
    batch: tuple[list[types.Datum], PackedBatch], h: dict[str, Any], as_json: bool, enc: str, data: st.DataObject
) -> None:
    """A body in one zstd frame (however it was written) decodes exactly like the raw body."""
    raw, ct = (json_body(batch[0], h), JSON) if as_json else (proto_body(batch[0], h), PROTO)
    assert_same_request(decode(data.draw(zstd_frames(raw)), ct, enc), h, batch[1])


@FAST
@given(sdk_batches(max_datums=2), headers, st.booleans(), st.data())
def test_one_zstd_frame_only_and_size_limit_is_exact(
    batch: tuple[list[types.Datum], PackedBatch], h: dict[str, Any], as_json: bool, data: st.DataObject
) -> None:
    """The codec accepts exactly one frame (two concatenated are a UserError on `body`), and max_body_bytes bounds
    the raw and the decompressed size alike: one byte short is LimitExceeded on `body`, the exact size decodes."""
    raw, ct = (json_body(batch[0], h), JSON) if as_json else (proto_body(batch[0], h), PROTO)
    cut = data.draw(st.integers(0, len(raw)))
    with pytest.raises(UserError) as two_frames:
        decode(data.draw(zstd_frames(raw[:cut])) + data.draw(zstd_frames(raw[cut:])), ct, "zstd")
    assert two_frames.value.field == "body" and not isinstance(two_frames.value, LimitExceeded)
    cells = max((v.size for v in batch[1].loss_inputs.values()), default=0)  # CSR densification shares the bound
    for body, enc in ((raw, None), (data.draw(zstd_frames(raw)), "zstd")):
        with pytest.raises(LimitExceeded) as over:
            decode(body, ct, enc, max_body_bytes=len(raw) - 1)
        assert over.value.field == "body"
        assert_same_request(decode(body, ct, enc, max_body_bytes=max(len(raw), len(body), cells)), h, batch[1])


# ------------------------------------------------------------------------- order and chunk splitting


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _interleave(draw: st.DrawFn, ordered: list[bytes], free: list[bytes]) -> bytes:
    """ordered (a repeated field: order kept) and free parts shuffled together on the wire."""
    slots = draw(st.permutations([True] * len(ordered) + [False] * len(free)))
    it_ordered, it_free = iter(ordered), iter(draw(st.permutations(free)))
    return b"".join(next(it_ordered) if is_ordered else next(it_free) for is_ordered in slots)


@st.composite
def split_datum(draw: st.DrawFn, d: types.Datum) -> types.Datum:
    """The same datum with its tokens cut into several EncodedTextChunks and its inputs in another key order."""
    toks = d.model_input.to_ints()
    cuts = sorted(draw(st.lists(st.integers(0, len(toks)), max_size=4)))
    bounds = [0, *cuts, len(toks)]
    chunks = [types.EncodedTextChunk(tokens=toks[lo:hi]) for lo, hi in itertools.pairwise(bounds)]
    keys = draw(st.permutations(list(d.loss_fn_inputs)))
    return types.Datum(
        model_input=types.ModelInput(chunks=chunks), loss_fn_inputs={k: d.loss_fn_inputs[k] for k in keys}
    )


@st.composite
def shuffled_wire(draw: st.DrawFn, msg: pb.ForwardBackwardRequest) -> bytes:
    """msg's encoding with every field (of the request and of each datum) in a random wire order; repeated fields
    keep their relative order, each loss input and config entry travels as its own map entry."""
    datums = []
    for d in msg.data:
        chunks = [pb.Datum(model_input=[c]).SerializeToString() for c in d.model_input]
        inputs = [pb.Datum(loss_fn_inputs={k: v}).SerializeToString() for k, v in d.loss_fn_inputs.items()]
        datums.append(_field(3, _interleave(draw, chunks, inputs)))
    top = [
        pb.ForwardBackwardRequest(model_id=msg.model_id).SerializeToString(),
        pb.ForwardBackwardRequest(seq_id=msg.seq_id).SerializeToString(),
        pb.ForwardBackwardRequest(loss_fn=msg.loss_fn).SerializeToString(),
    ]
    top += [pb.ForwardBackwardRequest(loss_fn_config={k: v}).SerializeToString() for k, v in msg.loss_fn_config.items()]
    top += [
        pb.ForwardBackwardRequest(loss_fn_config_v2={k: v}).SerializeToString()
        for k, v in msg.loss_fn_config_v2.items()
    ]
    return _interleave(draw, datums, top)


@FAST
@given(sdk_batches(), headers, st.data())
def test_chunk_splits_and_field_order_do_not_matter(
    batch: tuple[list[types.Datum], PackedBatch], h: dict[str, Any], data: st.DataObject
) -> None:
    """Tokens split over several chunks, loss inputs in another key order and fields in another wire order decode
    to the batch of the single-chunk, canonical-order request."""
    datums, want = batch
    split = [data.draw(split_datum(d)) for d in datums]
    assert_same_request(decode(proto_body(split, h)), h, want)
    assert_same_request(decode(data.draw(shuffled_wire(proto_msg(split, h)))), h, want)
    assert_same_request(decode(json_body(split, h, data.draw(st.booleans())), JSON), h, want)


# ------------------------------------------------------------------------------------------- outputs


@st.composite
def results(draw: st.DrawFn) -> ForwardBackwardResult:
    """A ForwardBackwardResult with 0-4 datums (length 0 included) and 1-3 outputs of assorted dtypes and shapes."""
    lengths = draw(st.lists(st.integers(0, 5), max_size=4))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    outputs = {}
    for name in draw(
        st.lists(
            st.sampled_from(["logprobs", "elementwise_loss", "values", "topk"]), min_size=1, max_size=3, unique=True
        )
    ):
        dtype = draw(st.sampled_from([np.float32, np.float64, np.int32, np.int64]))
        elements = INT32 if np.dtype(dtype).kind == "i" else st.floats(width=32, allow_nan=False)
        shape = (int(offsets[-1]), *draw(st.sampled_from([(), (1,), (3,)])))
        outputs[name] = draw(hnp.arrays(dtype, shape, elements=elements))
    metrics = draw(
        st.dictionaries(st.sampled_from(["loss:sum", "tokens:sum", "x:mean"]), st.floats(allow_nan=False), max_size=3)
    )
    return ForwardBackwardResult(offsets, outputs, metrics)


@FAST
@given(results())
def test_output_round_trips_through_sdk_and_json_views(result: ForwardBackwardResult) -> None:
    """The SDK decodes the protobuf output to the per-datum slices (int64 / float32), and both JSON views (from the
    result and from the stored protobuf) are equal and parse with the SDK's TensorData to the same arrays."""
    payload = encode_forward_backward_output(result)
    out = response_conv.deserialize_forward_backward_output(payload)
    assert out.loss_fn_output_type == "ArrayRecord" and out.metrics == result.metrics
    assert len(out.loss_fn_outputs) == len(result.offsets) - 1
    view = forward_backward_output_to_json(result)
    assert forward_backward_json_from_proto(payload) == view
    assert json.loads(json.dumps(view)) == view and view["metrics"] == result.metrics
    for i, (lo, hi) in enumerate(zip(result.offsets[:-1], result.offsets[1:])):
        assert set(out.loss_fn_outputs[i]) == set(view["loss_fn_outputs"][i]) == set(result.outputs)
        for name, arr in result.outputs.items():
            want = arr[lo:hi].astype(np.int64 if arr.dtype.kind == "i" else np.float32)
            td = out.loss_fn_outputs[i][name]
            assert td.dtype == view["loss_fn_outputs"][i][name]["dtype"] == str(want.dtype)
            assert td.shape == view["loss_fn_outputs"][i][name]["shape"] == list(want.shape)
            np.testing.assert_array_equal(td.to_numpy(), want)
            parsed = PydTensorData.model_validate(view["loss_fn_outputs"][i][name]).to_numpy()
            assert parsed.dtype == want.dtype
            np.testing.assert_array_equal(parsed, want)


# ------------------------------------------------------------------------------------ malformed bodies


def peek_sequence(body: bytes, ct: str, enc: str | None) -> tuple[str, int] | None:
    """The (model_id, seq_id) the ingress would fail a refused body's future with: read from the protobuf header
    alone (app.protocol.skeleton), or from the parsed JSON."""
    try:
        plain = decompress(body, enc, SMALL)
        if is_json(ct):
            obj = json.loads(plain)
            return valid_sequence(obj.get("model_id"), obj.get("seq_id")) if isinstance(obj, dict) else None
        return valid_sequence(*read_header(plain))
    except (UserError, ValueError, RecursionError):
        return None


def check_decode(body: bytes, ct: str, enc: str | None) -> None:
    """Decode with a small limit: a UserError or a well-formed batch, never another exception; peek_sequence only
    ever returns None or (non-empty model_id, seq_id >= 1)."""
    seq = peek_sequence(body, ct, enc)
    assert seq is None or (isinstance(seq[0], str) and seq[0] and isinstance(seq[1], int) and seq[1] >= 1)
    try:
        b = decode(body, ct, enc, max_body_bytes=SMALL).batch
    except UserError:
        return
    assert b.tokens.ndim == 1 and b.tokens.dtype == np.int64
    assert b.offsets[0] == 0 and b.offsets[-1] == len(b.tokens) and np.all(np.diff(b.offsets) >= 0)
    for k, v in b.loss_inputs.items():
        assert v.ndim in (1, 2) and v.shape[0] == len(b.tokens) and v.size <= SMALL
        assert v.dtype == (np.int64 if k == "target_tokens" else np.float32)


content_types = st.sampled_from([PROTO, JSON, f"{JSON}; charset=utf-8", "application/vnd.x+json", "", "text/plain"])
encodings = st.sampled_from([None, "", "identity", "zstd", " ZSTD", "gzip"])
small_batches = sdk_batches(max_datums=2, max_len=4)


@st.composite
def valid_bodies(draw: st.DrawFn) -> tuple[bytes, str, str | None]:
    """A valid body with its content type and encoding: protobuf or JSON, raw or one zstd frame."""
    data, _ = draw(small_batches)
    h = draw(headers)
    body, ct = (json_body(data, h), JSON) if draw(st.booleans()) else (proto_body(data, h), PROTO)
    if draw(st.booleans()):
        return zstandard.ZstdCompressor().compress(body), ct, "zstd"
    return body, ct, None


@FUZZ
@given(st.binary(max_size=256), content_types, encodings)
def test_random_bytes_never_crash(body: bytes, ct: str, enc: str | None) -> None:
    """Arbitrary bytes under every content type and encoding."""
    check_decode(body, ct, enc)


@FUZZ
@given(valid_bodies(), st.data())
def test_truncated_and_bit_flipped_bodies_never_crash(
    valid: tuple[bytes, str, str | None], data: st.DataObject
) -> None:
    """Valid bodies (protobuf or JSON, raw or zstd) cut short, and with 1-8 bits flipped."""
    body, ct, enc = valid
    cut = data.draw(st.integers(0, len(body)))
    check_decode(body[:cut], ct, enc)
    flipped = bytearray(body)
    for bit in data.draw(st.lists(st.integers(0, 8 * len(body) - 1), min_size=1, max_size=8)):
        flipped[bit // 8] ^= 1 << (bit % 8)
    check_decode(bytes(flipped), ct, enc)


@FUZZ
@given(st.binary(max_size=200), st.binary(max_size=64), st.data())
def test_zstd_like_garbage_never_crashes(payload: bytes, junk: bytes, data: st.DataObject) -> None:
    """Garbage behind a zstd magic number, frames with junk around them, and skippable frames."""
    frame = zstandard.ZstdCompressor().compress(payload)
    skippable = b"\x50\x2a\x4d\x18" + len(junk).to_bytes(4, "little") + junk
    for body in (
        b"\x28\xb5\x2f\xfd" + junk,
        frame + junk,
        junk + frame,
        skippable + frame,
        frame + skippable,
        frame[:4] + junk + frame[4 + len(junk) :],
    ):
        check_decode(body, data.draw(content_types), "zstd")


known_keys = st.sampled_from(
    [
        "model_id",
        "seq_id",
        "loss_fn",
        "forward_backward_input",
        "data",
        "model_input",
        "chunks",
        "type",
        "tokens",
        "loss_fn_inputs",
        "loss_fn_config",
        "dtype",
        "shape",
        "sparse_crow_indices",
        "sparse_col_indices",
        "target_tokens",
        "weights",
    ]
)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(2**1023, 2**1100)
    | st.floats()
    | st.text(max_size=8)
    | st.sampled_from(["encoded_text", "int64", "float32", "int32"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(known_keys | st.text(max_size=4), inner, max_size=5),
    max_leaves=16,
)


def _paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path (keys and indices) to a node of a parsed JSON document."""
    children = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    return [prefix] + [p for k, v in children for p in _paths(v, (*prefix, k))]


def _replace(obj: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    obj[path[0]] = _replace(obj[path[0]], path[1:], value)
    return obj


@FUZZ
@given(json_values)
def test_random_json_never_crashes(doc: Any) -> None:
    """Random JSON documents, their objects keyed partly by the request's own field names."""
    check_decode(json.dumps(doc).encode(), JSON, None)


@FUZZ
@given(small_batches, headers, st.data())
def test_mutated_json_requests_never_crash(
    batch: tuple[list[types.Datum], PackedBatch], h: dict[str, Any], data: st.DataObject
) -> None:
    """A valid JSON request with 1-3 nodes replaced by random JSON: a UserError or a well-formed batch; peek_sequence
    still finds model_id and seq_id when the replaced nodes are elsewhere."""
    doc = json.loads(json_body(batch[0], h, data.draw(st.booleans())))
    header_kept = True
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(_paths(doc)))
        header_kept &= bool(path) and path[0] not in ("model_id", "seq_id")
        doc = _replace(doc, path, data.draw(json_values))
    body = json.dumps(doc).encode()
    check_decode(body, JSON, None)
    if header_kept and len(body) <= SMALL:  # a body over the cap is refused unread: no sequence to find in it
        assert peek_sequence(body, JSON, None) == (h["model_id"], h["seq_id"])


@FAST
@given(st.integers(1, 3000), st.sampled_from([("[", "]"), ('{"a":', "}")]))
def test_deeply_nested_json_never_crashes(depth: int, brackets: tuple[str, str]) -> None:
    """Nesting deep enough to exhaust the JSON parser's recursion is rejected like any other bad body."""
    nest = brackets[0] * depth + "0" + brackets[1] * depth
    doc = '{"model_id": "m", "seq_id": 1, "data": [{"model_input": {"chunks": ' + nest + "}}]}"
    check_decode(doc.encode(), JSON, None)


def _itemsize(t: pb.Tensor) -> int:
    return 4 if t.dtype in (pb.DTYPE_FLOAT32, pb.DTYPE_INT32) else 8


def _tensor_mutations(draw: st.DrawFn, t: pb.Tensor, n: int) -> None:
    """One random edit of a tensor: dtype, shape (alone, or with dense bytes to match), dense bytes, or a CSR
    layout for (n, cols) that is consistent except for the parts drawn at random."""
    op = draw(st.sampled_from(["shape", "csr", "dtype", "dense"]))
    dims = st.sampled_from([0, 1, n, -1, 2**62, 2**63 - 1])
    if op == "dtype":
        t.dtype = draw(st.integers(0, 6))
    elif op == "shape":
        shape = draw(st.lists(dims, max_size=3))
        del t.shape[:]
        t.shape.extend(shape)
        cells = int(np.prod(shape, dtype=object))
        if draw(st.booleans()) and 0 <= cells <= 64:
            t.dense = bytes(cells * _itemsize(t))
    elif op == "dense":
        t.dense = draw(st.binary(max_size=64))
    else:
        corrupt = draw(st.sets(st.sampled_from(["crow", "col", "values", "shape"]), max_size=2))
        crow = np.cumsum([0, *draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))])
        col = draw(st.lists(st.integers(-1, 3), min_size=int(crow[-1]), max_size=int(crow[-1])))
        int64s = st.lists(st.integers(-1, n + 2) | INT64, max_size=n + 2)
        csr = t.sparse_csr
        csr.crow_indices = np.array(draw(int64s) if "crow" in corrupt else crow, "<i8").tobytes()
        csr.col_indices = np.array(draw(int64s) if "col" in corrupt else col, "<i8").tobytes()
        csr.values = draw(st.binary(max_size=48)) if "values" in corrupt else bytes(len(col) * _itemsize(t))
        del t.shape[:]
        t.shape.extend(draw(st.lists(dims, max_size=3)) if "shape" in corrupt else [n, draw(dims)])


def _mutate_tensor(draw: st.DrawFn, msg: pb.ForwardBackwardRequest) -> None:
    """One random edit of one datum's loss input (an existing one or a new one)."""
    d = msg.data[draw(st.integers(0, len(msg.data) - 1))]
    name = draw(st.sampled_from([*d.loss_fn_inputs, "weights", "x"]))
    if name not in d.loss_fn_inputs:
        d.loss_fn_inputs[name].dtype = draw(st.sampled_from([pb.DTYPE_FLOAT32, pb.DTYPE_INT64]))
    _tensor_mutations(draw, d.loss_fn_inputs[name], sum(len(c.encoded_text.tokens) // 4 for c in d.model_input))


def _mutate_structure(draw: st.DrawFn, msg: pb.ForwardBackwardRequest) -> None:
    """One random structural edit: a datum's chunks, an extra empty datum, or a config value with no arm set."""
    d = msg.data[draw(st.integers(0, len(msg.data) - 1))]
    op = draw(st.sampled_from(["tokens", "chunk", "drop_chunks", "datum", "config"]))
    if op == "tokens":
        d.model_input.add().encoded_text.tokens = draw(st.binary(max_size=24))
    elif op == "chunk":
        chunk = d.model_input.add()
        kind = draw(st.sampled_from(["empty", "image", "dmel"]))
        if kind == "image":
            chunk.image.data = draw(st.binary(max_size=8))
        elif kind == "dmel":
            chunk.dmel.dmel = draw(st.binary(max_size=8))
    elif op == "drop_chunks":
        del d.model_input[:]
    elif op == "datum":
        msg.data.add()
    else:
        msg.loss_fn_config_v2[draw(UTF8_TEXT)].Clear()


@FUZZ
@given(small_batches, headers, st.sampled_from([_mutate_tensor, _mutate_structure]), st.data())
def test_mutated_proto_requests_never_crash(
    batch: tuple[list[types.Datum], PackedBatch],
    h: dict[str, Any],
    mutate: Callable[[st.DrawFn, pb.ForwardBackwardRequest], None],
    data: st.DataObject,
) -> None:
    """A valid protobuf request with 1-3 edits of its loss inputs (dtypes, shapes, byte lengths, CSR parts) or of
    its structure (chunk kinds, empty datums, config values with no arm): a UserError or a well-formed batch;
    peek_sequence still finds the request's model_id and seq_id."""
    msg = proto_msg(batch[0], h)
    for _ in range(data.draw(st.integers(1, 3))):
        mutate(data.draw, msg)
    body = msg.SerializeToString()
    check_decode(body, PROTO, None)
    assert peek_sequence(body, PROTO, None) == (h["model_id"], h["seq_id"])
