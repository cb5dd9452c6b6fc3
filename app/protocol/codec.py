"""Wire codec for forward / forward_backward requests: protobuf, zstd, legacy JSON (results: app.protocol.results).

Requests are decoded straight into a PackedBatch; every structural problem becomes a UserError whose `field` names
the offending request field (``data[3].loss_fn_inputs.weights``). An image pointer chunk (JSON only: protobuf has no
such chunk) becomes an image chunk holding its file's bytes (app.images.assets). The only limits applied here bound
memory (body size, zstd output, then, before any datum is decoded, the datum count and the loss inputs' cells:
app.protocol.bounds); semantic checks (vocab range, loss names, token counts) belong to the caller.
"""

from __future__ import annotations

import base64
import io
import json
import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import zstandard
from google.protobuf.message import DecodeError

from app.config import LimitsConfig
from app.errors import LimitExceeded, UserError
from app.images.assets import NO_ASSETS, ImageAssets
from app.protocol.bounds import (
    CellBudget,
    Counter,
    CountLimits,
    check_config_entries,
    check_datum_count,
)
from app.protocol.chunks import IMAGE, IMAGE_KINDS, IMAGE_POINTER, TEXT, ImageCounter, not_text
from app.protocol.proto import pb
from app.protocol.provenance import collect, provenance_from_json, provenance_from_proto
from app.protocol.skeleton import scan_counts
from app.protocol.wire import INT64_MAX
from app.training_data.batch import BatchImage, ForwardBackwardInput, PackedBatch

__all__ = [
    "Bounds",
    "Outcome",
    "decode_forward_backward",
    "decode_plain",
    "decompress",
    "is_json",
    "valid_sequence",
]

# Wire dtype of each proto DType; INT32 and BFLOAT16 (raw uint16) are widened after reading.
_PROTO_DTYPES: dict[int, np.dtype] = {
    pb.DTYPE_FLOAT32: np.dtype("<f4"),
    pb.DTYPE_INT64: np.dtype("<i8"),
    pb.DTYPE_INT32: np.dtype("<i4"),
    pb.DTYPE_BFLOAT16: np.dtype("<u2"),
}
_JSON_DTYPES = {"float32": np.float32, "int64": np.int64, "int32": np.int64}
_INT_INPUTS = frozenset({"target_tokens"})
_LIMITS = LimitsConfig()  # the defaults of the bounds a caller leaves out
_COUNTS = CountLimits.of(_LIMITS)


def _err(field: str, message: str) -> UserError:
    return UserError(f"{field} {message}", field=field)


def _decompress_zstd(body: bytes, max_body_bytes: int) -> bytes:
    """Decompress one zstd frame; a streaming first pass bounds the output before anything is buffered."""
    dctx = zstandard.ZstdDecompressor()
    try:
        size = 0
        for chunk in dctx.read_to_iter(io.BytesIO(body), write_size=1 << 20):
            size += len(chunk)
            if size > max_body_bytes:
                raise LimitExceeded(f"body exceeds {max_body_bytes} bytes after zstd decompression", field="body")
        obj = dctx.decompressobj()
        out = obj.decompress(body)  # same output as the pass above, so bounded
    except zstandard.ZstdError as exc:
        raise _err("body", f"is not valid zstd data: {exc}") from exc
    if not obj.eof or obj.unused_data:
        raise _err("body", "is not exactly one complete zstd frame (truncated or trailing data)")
    return out


@dataclass(frozen=True)
class Bounds:
    """Every bound the decoder applies (LimitsConfig's fields; `of` reads them)."""

    max_body_bytes: int = _LIMITS.max_request_bytes
    max_datums: int = _LIMITS.max_datums_per_request
    max_cells: int = _LIMITS.max_loss_input_cells_per_request
    max_sparse_width: int = _LIMITS.max_sparse_input_width
    counts: CountLimits = _COUNTS
    assets: ImageAssets = NO_ASSETS  # where image pointers may point

    @classmethod
    def of(cls, limits: LimitsConfig, assets: ImageAssets = NO_ASSETS) -> Bounds:
        return cls(
            limits.max_request_bytes,
            limits.max_datums_per_request,
            limits.max_loss_input_cells_per_request,
            limits.max_sparse_input_width,
            CountLimits.of(limits),
            assets,
        )


@dataclass(frozen=True)
class Outcome:
    """A decoded body, or the user error it was refused with and, when the body named them, its (model_id,
    seq_id) (so the caller can fail that seq_id's future); what a decoding process sends back."""

    decoded: ForwardBackwardInput | None
    error: UserError | None = None
    sequence: tuple[str, int] | None = None


def decompress(body: bytes, content_encoding: str | None, max_body_bytes: int) -> bytes:
    """The body as sent (raw or zstd), bounded by max_body_bytes before and after decompression."""
    if len(body) > max_body_bytes:
        raise LimitExceeded(f"body exceeds {max_body_bytes} bytes", field="body")
    encoding = (content_encoding or "identity").strip().lower()
    if encoding == "zstd":
        return _decompress_zstd(body, max_body_bytes)
    if encoding not in ("identity", ""):
        raise _err("body", f"has unsupported Content-Encoding {content_encoding!r} (use zstd or none)")
    return body


def is_json(content_type: str) -> bool:
    """Whether a body of `content_type` is JSON (older SDKs); anything else is read as protobuf."""
    mime = (content_type or "").split(";", 1)[0].strip().lower()
    return mime == "application/json" or mime.endswith("+json")


def valid_sequence(model_id: object, seq_id: object) -> tuple[str, int] | None:
    """(model_id, seq_id) when they can name a future: a non-empty id and a seq_id in [1, INT64_MAX]."""
    if isinstance(model_id, str) and model_id and type(seq_id) is int and 1 <= seq_id <= INT64_MAX:
        return model_id, seq_id
    return None


def decode_plain(plain: bytes, json_body: bool, bounds: Bounds = Bounds()) -> Outcome:
    """Decode a decompressed body: protobuf, after its counts are scanned from the wire (its model_id and seq_id
    are read by app.protocol.skeleton.read_header, before this), or JSON, whose sequence comes back with an error."""
    budget = CellBudget(bounds.max_cells, bounds.max_sparse_width)
    if not json_body:
        try:
            scan_counts(plain, bounds.max_datums, bounds.counts)
            return Outcome(_decode_proto(plain, bounds.max_datums, budget, bounds.counts))  # protobuf has no pointers
        except UserError as exc:
            return Outcome(None, exc)
    try:
        obj = _parse_json(plain)
    except UserError as exc:
        return Outcome(None, exc)
    try:
        room = bounds.max_body_bytes - len(plain)  # for the images by location, as if they were in the body
        return Outcome(_decode_json(obj, bounds.max_datums, budget, bounds.counts, bounds.assets, room))
    except UserError as exc:
        return Outcome(None, exc, valid_sequence(obj.get("model_id"), obj.get("seq_id")))


def decode_forward_backward(
    body: bytes,
    content_type: str,
    content_encoding: str | None,
    *,
    max_body_bytes: int,
    max_datums: int = _LIMITS.max_datums_per_request,
    max_cells: int = _LIMITS.max_loss_input_cells_per_request,
    max_sparse_width: int = _LIMITS.max_sparse_input_width,
    counts: CountLimits = _COUNTS,
    assets: ImageAssets = NO_ASSETS,
) -> ForwardBackwardInput:
    """Decode a forward_backward body: protobuf (or JSON from older SDKs), optionally zstd-compressed; a UserError
    when it is refused.

    max_body_bytes bounds the raw and the decompressed body; before any datum is decoded, max_datums bounds their
    number, max_cells the cells of all loss inputs (CSR ones densified), max_sparse_width a CSR tensor's width and
    `counts` every other count the body carries; `assets` says where image pointers may point.
    """
    bounds = Bounds(max_body_bytes, max_datums, max_cells, max_sparse_width, counts, assets)
    outcome = decode_plain(decompress(body, content_encoding, max_body_bytes), is_json(content_type), bounds)
    if outcome.decoded is None:
        assert outcome.error is not None
        raise outcome.error
    return outcome.decoded


def _pack(datums: list[tuple[np.ndarray, dict[str, np.ndarray]]], images: tuple[BatchImage, ...] = ()) -> PackedBatch:
    """Check cross-datum consistency and concatenate the per-datum arrays."""
    if not datums:
        raise _err("data", "is empty; at least one datum is required")
    names0 = set(datums[0][1])
    trailing0 = {k: v.shape[1:] for k, v in datums[0][1].items()}
    for i, (_, inputs) in enumerate(datums[1:], start=1):
        if set(inputs) != names0:
            raise _err(f"data[{i}].loss_fn_inputs", f"has keys {sorted(inputs)} but data[0] has {sorted(names0)}")
        for k, v in inputs.items():
            if v.shape[1:] != trailing0[k]:
                raise _err(
                    f"data[{i}].loss_fn_inputs.{k}",
                    f"has trailing shape {list(v.shape[1:])} but data[0] has {list(trailing0[k])}",
                )
    lengths = [len(t) for t, _ in datums]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    tokens = np.concatenate([t for t, _ in datums]).astype(np.int64, copy=False)
    loss_inputs = {k: np.concatenate([inp[k] for _, inp in datums]) for k in sorted(names0)}
    return PackedBatch(tokens, offsets, loss_inputs, images)


def _finish_tensor(field: str, name: str, arr: np.ndarray, n_tokens: int) -> np.ndarray:
    """Coerce dtype (target_tokens int64, rest float32) and check the leading dimension."""
    if arr.ndim not in (1, 2):
        raise _err(field, f"has shape {list(arr.shape)}; only (N,) or (N, K) is supported")
    if arr.shape[0] != n_tokens:
        raise _err(field, f"has length {arr.shape[0]} but model_input has {n_tokens} tokens")
    if name in _INT_INPUTS:
        if arr.dtype.kind == "f" and not (np.all(np.isfinite(arr)) and np.all(arr == np.round(arr))):
            raise _err(field, "must hold integers")
        return arr.astype(np.int64, copy=False)
    return arr.astype(np.float32, copy=False)


def _densify(
    field: str, values: np.ndarray, crow: np.ndarray, col: np.ndarray, shape: list[int], n_tokens: int
) -> np.ndarray:
    """Expand a CSR tensor; unlisted cells are 0. Its size was bounded (CellBudget) before any datum was decoded."""
    if len(shape) != 2:
        raise _err(field, f"is sparse CSR with shape {shape}; CSR must be 2-D")
    rows, cols = shape
    if rows < 0 or cols < 0:
        raise _err(field, f"has negative shape {shape}")
    if rows != n_tokens:
        raise _err(field, f"has length {rows} but model_input has {n_tokens} tokens")
    nnz = len(values)
    if len(crow) != rows + 1 or len(col) != nnz or crow[0] != 0 or crow[-1] != nnz:
        raise _err(field, f"has inconsistent sparse CSR indices for shape {shape} and {nnz} values")
    if np.any(np.diff(crow) < 0) or np.any((col < 0) | (col >= cols)):
        raise _err(field, f"has inconsistent sparse CSR indices for shape {shape} and {nnz} values")
    dense = np.zeros((rows, cols), dtype=values.dtype)
    dense[np.repeat(np.arange(rows), np.diff(crow)), col] = values
    return dense


def _from_bytes(field: str, raw: bytes, dtype: np.dtype) -> np.ndarray:
    if len(raw) % dtype.itemsize:
        raise _err(field, f"has {len(raw)} bytes, not a multiple of the dtype size {dtype.itemsize}")
    return np.frombuffer(raw, dtype=dtype)


def _reshape(field: str, arr: np.ndarray, shape: list[int] | None) -> np.ndarray:
    if shape is None:
        return arr
    if any(s < 0 for s in shape) or math.prod(shape) != arr.size:
        raise _err(field, f"has {arr.size} values but shape {shape}")
    try:
        return arr.reshape(shape)
    except ValueError as exc:  # zero-size, but a dimension beyond what numpy can index
        raise _err(field, f"has an impossible shape {shape}") from exc


def _widen(arr: np.ndarray, proto_dtype: int) -> np.ndarray:
    if proto_dtype == pb.DTYPE_BFLOAT16:
        return (arr.astype(np.uint32) << 16).view(np.float32)
    if proto_dtype == pb.DTYPE_INT32:
        return arr.astype(np.int64)
    return arr


def _proto_tensor(field: str, name: str, msg: pb.Tensor, n_tokens: int) -> np.ndarray:
    if msg.dtype not in _PROTO_DTYPES:
        raise _err(f"{field}.dtype", f"is unknown ({msg.dtype}); expected FLOAT32, INT64, INT32 or BFLOAT16")
    np_dtype = _PROTO_DTYPES[msg.dtype]
    shape = [int(s) for s in msg.shape]
    if msg.WhichOneof("encoding") == "sparse_csr":
        csr = msg.sparse_csr
        values = _widen(_from_bytes(f"{field}.sparse_csr.values", csr.values, np_dtype), msg.dtype)
        crow = _from_bytes(f"{field}.sparse_csr.crow_indices", csr.crow_indices, np.dtype("<i8"))
        col = _from_bytes(f"{field}.sparse_csr.col_indices", csr.col_indices, np.dtype("<i8"))
        arr = _densify(field, values, crow, col, shape, n_tokens)
    else:
        arr = _widen(_from_bytes(field, msg.dense, np_dtype), msg.dtype)
        arr = _reshape(field, arr, shape or None)
    return _finish_tensor(field, name, arr, n_tokens)


def _proto_bounds(req: pb.ForwardBackwardRequest, max_datums: int, budget: CellBudget) -> None:
    """The datum count and every loss input's cells, from the message alone."""
    check_datum_count(len(req.data), max_datums)
    for i, d in enumerate(req.data):
        for name, t in d.loss_fn_inputs.items():
            field = f"data[{i}].loss_fn_inputs.{name}"
            if t.WhichOneof("encoding") == "sparse_csr":
                budget.add_sparse(field, [int(s) for s in t.shape])
            elif t.dtype in _PROTO_DTYPES:
                budget.add_dense(field, len(t.dense) // _PROTO_DTYPES[t.dtype].itemsize)


def _decode_proto(body: bytes, max_datums: int, budget: CellBudget, counts: CountLimits) -> ForwardBackwardInput:
    req = pb.ForwardBackwardRequest()
    try:
        req.ParseFromString(body)
    except DecodeError as exc:
        raise _err("body", f"is not a valid ForwardBackwardRequest protobuf: {exc}") from exc
    _proto_bounds(req, max_datums, budget)
    datums, provenance = [], []
    images = ImageCounter(counts)
    for i, d in enumerate(req.data):
        parts: list[np.ndarray] = []
        for j, chunk in enumerate(d.model_input):
            kind, field = chunk.WhichOneof("chunk"), f"data[{i}].model_input[{j}]"
            if kind == IMAGE:
                image = chunk.image
                if image.HasField("override_dimensions"):
                    raise _err(f"{field}.override_dimensions", "is not supported: send the image at its size")
                expected = image.expected_tokens if image.HasField("expected_tokens") else None
                at = sum(len(p) for p in parts)
                parts.append(images.add(i, at, field, bytes(image.data), image.format, expected))
            elif kind == TEXT:
                parts.append(_from_bytes(f"{field}.tokens", chunk.encoded_text.tokens, np.dtype("<i4")))
            else:
                raise not_text(field, kind)
        tokens = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
        inputs = {
            name: _proto_tensor(f"data[{i}].loss_fn_inputs.{name}", name, t, len(tokens))
            for name, t in d.loss_fn_inputs.items()
        }
        datums.append((tokens, inputs))
        provenance.append(provenance_from_proto(i, d))
    config: dict[str, float | str] = {k: float(v) for k, v in req.loss_fn_config.items()}
    for k, v in req.loss_fn_config_v2.items():
        arm = v.WhichOneof("value")
        if arm is None:
            raise _err(f"loss_fn_config_v2.{k}", "has neither number nor text set")
        config[k] = float(v.number) if arm == "number" else str(v.text)
    batch = _pack(datums, images.images())
    return ForwardBackwardInput(
        req.model_id, int(req.seq_id), req.loss_fn, config, bool(req.forward_only), batch, collect(provenance, counts)
    )


def _json_shape(obj: dict[str, Any]) -> list[int] | None:
    """A JSON tensor's declared shape; TypeError, ValueError or OverflowError when it is not a list of integers."""
    return [int(s) for s in obj["shape"]] if obj.get("shape") is not None else None


def _json_sparse(obj: dict[str, Any]) -> bool:
    return obj.get("sparse_crow_indices") is not None or obj.get("sparse_col_indices") is not None


def _json_values(data: Any) -> int:
    """How many values a dense JSON tensor carries: a flat list, or a list of equal rows."""
    if not isinstance(data, list) or not data:
        return 0
    return len(data) * (len(data[0]) if isinstance(data[0], list) else 1)


def _json_counts(i: int, d: Any, counter: Counter) -> None:
    """Datum i's chunks, loss inputs and spans (lists of another type are left to the decoder, which names them)."""
    counter.next_datum()
    if not isinstance(d, dict):
        return
    model_input = d.get("model_input")
    chunks = model_input.get("chunks") if isinstance(model_input, dict) else None
    counter.add_chunks(i, len(chunks) if isinstance(chunks, list) else 0)
    inputs = d.get("loss_fn_inputs")
    counter.add_inputs(i, len(inputs) if isinstance(inputs, dict) else 0)
    for name in ("model_input_spans", "loss_fn_input_spans"):
        spans = d.get(name)
        counter.add_spans(f"data[{i}].{name}", len(spans) if isinstance(spans, list) else 0)


def _json_bounds(data: list[Any], max_datums: int, budget: CellBudget, counts: CountLimits) -> None:
    """The datum count, every other count and every loss input's cells, before any is converted; malformed ones are
    left to the decoder, which names them."""
    check_datum_count(len(data), max_datums)
    counter = Counter(counts)
    for i, d in enumerate(data):
        _json_counts(i, d, counter)
    for i, d in enumerate(data):
        inputs = d.get("loss_fn_inputs") if isinstance(d, dict) else None
        for name, obj in inputs.items() if isinstance(inputs, dict) else ():
            if not isinstance(obj, dict):
                continue
            field = f"data[{i}].loss_fn_inputs.{name}"
            shape = obj.get("shape")
            if isinstance(shape, list) and len(shape) > 2:
                raise _err(field, f"has a shape of {len(shape)} dimensions; only (N,) or (N, K) is supported")
            if not _json_sparse(obj):
                budget.add_dense(field, _json_values(obj.get("data")))
                continue
            try:
                shape = _json_shape(obj)
            except (TypeError, ValueError, OverflowError):
                continue
            budget.add_sparse(field, shape or [])


def _json_tensor(field: str, name: str, obj: Any, n_tokens: int) -> np.ndarray:
    if not isinstance(obj, dict):
        raise _err(field, "must be an object with data and dtype")
    dtype = obj.get("dtype")
    if not isinstance(dtype, str) or dtype not in _JSON_DTYPES:
        raise _err(f"{field}.dtype", f"is unknown ({dtype!r}); expected 'int64' or 'float32'")
    try:
        raw = np.asarray(obj.get("data") or [])
        if raw.size and (raw.dtype.kind not in "iuf" or (dtype != "float32" and raw.dtype.kind == "f")):
            raise _err(field, f"data must hold {'numbers' if dtype == 'float32' else 'integers'}")
        values = raw.astype(_JSON_DTYPES[dtype])
        shape = _json_shape(obj)
        if _json_sparse(obj):
            crow, col = obj.get("sparse_crow_indices") or [], obj.get("sparse_col_indices") or []
            crow_a, col_a = np.asarray(crow, dtype=np.int64), np.asarray(col, dtype=np.int64)
            arr = _densify(field, values.reshape(-1), crow_a, col_a, shape or [], n_tokens)
            return _finish_tensor(field, name, arr, n_tokens)
    except (TypeError, ValueError, OverflowError) as exc:
        raise _err(field, f"is malformed: {exc}") from exc
    return _finish_tensor(field, name, _reshape(field, values, shape), n_tokens)


def _json_datum(i: int, d: Any, images: ImageCounter) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    if not isinstance(d, dict) or not isinstance(d.get("model_input"), dict):
        raise _err(f"data[{i}]", "must be an object with model_input and loss_fn_inputs")
    parts: list[np.ndarray] = []
    chunks = d["model_input"].get("chunks") or []
    if not isinstance(chunks, list):
        raise _err(f"data[{i}].model_input.chunks", "must be a list")
    for j, chunk in enumerate(chunks):
        kind = chunk.get("type", "encoded_text") if isinstance(chunk, dict) else "malformed"
        if kind in IMAGE_KINDS:
            parts.append(_json_image(i, f"data[{i}].model_input.chunks[{j}]", chunk, sum(map(len, parts)), images))
            continue
        if kind != TEXT:
            raise not_text(f"data[{i}].model_input.chunks[{j}]", kind)
        field = f"data[{i}].model_input.chunks[{j}].tokens"
        try:
            toks = np.asarray(chunk.get("tokens") or [])
        except ValueError as exc:  # ragged nesting
            raise _err(field, "must be a list of integers") from exc
        if toks.ndim != 1 or (toks.size and toks.dtype.kind not in "iu"):
            raise _err(field, "must be a list of integers")
        parts.append(toks.astype(np.int64))
    tokens = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    raw_inputs = d.get("loss_fn_inputs") or {}
    if not isinstance(raw_inputs, dict):
        raise _err(f"data[{i}].loss_fn_inputs", "must be an object")
    return tokens, {k: _json_tensor(f"data[{i}].loss_fn_inputs.{k}", k, v, len(tokens)) for k, v in raw_inputs.items()}


def _json_image(i: int, field: str, chunk: dict[str, Any], at: int, images: ImageCounter) -> np.ndarray:
    """An image chunk of the JSON form (`data` base64, `format`, `expected_tokens`), or a pointer chunk (`location`
    for `data`)."""
    data, fmt, expected = chunk.get("data"), chunk.get("format"), chunk.get("expected_tokens")
    if expected is not None and (not isinstance(expected, int) or isinstance(expected, bool)):
        raise _err(f"{field}.expected_tokens", "must be an integer")
    fmt = fmt if isinstance(fmt, str) else repr(fmt)
    if chunk.get("type") == IMAGE_POINTER:
        location = chunk.get("location")
        if not isinstance(location, str):
            raise _err(f"{field}.location", "must be a string: the image's path or URL")
        return images.point(i, at, field, location, fmt, expected)
    if not isinstance(data, str):
        raise _err(f"{field}.data", "must be a base64 string")
    try:
        raw = base64.b64decode(data, validate=True)
    except ValueError as exc:
        raise _err(f"{field}.data", "is not valid base64") from exc
    return images.add(i, at, field, raw, fmt, expected)


def _parse_json(body: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise _err("body", f"is not valid JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise _err("body", "must be a JSON object")
    return obj


def _decode_json(
    obj: dict[str, Any], max_datums: int, budget: CellBudget, counts: CountLimits, assets: ImageAssets, room: int
) -> ForwardBackwardInput:
    fbi = obj.get("forward_backward_input")
    inner = fbi if isinstance(fbi, dict) else obj
    model_id, seq_id, loss_fn = obj.get("model_id"), obj.get("seq_id") or 0, inner.get("loss_fn")
    if not isinstance(model_id, str):
        raise _err("model_id", "must be a string")
    if not isinstance(seq_id, int) or isinstance(seq_id, bool) or not 0 <= seq_id <= INT64_MAX:
        raise _err("seq_id", f"must be an integer in [0, {INT64_MAX}]")
    if not isinstance(loss_fn, str):
        raise _err("loss_fn", "must be a string")
    data = inner.get("data")
    if not isinstance(data, list):
        raise _err("data", "must be a list of datums")
    _json_bounds(data, max_datums, budget, counts)
    raw_config = inner.get("loss_fn_config") or {}
    if not isinstance(raw_config, dict):
        raise _err("loss_fn_config", "must be an object")
    check_config_entries(len(raw_config), counts)
    config: dict[str, float | str] = {}
    for k, v in raw_config.items():
        if isinstance(v, bool) or not isinstance(v, (int, float, str)):
            raise _err(f"loss_fn_config.{k}", "must be a number or a string")
        try:
            config[k] = v if isinstance(v, str) else float(v)
        except OverflowError as exc:  # an integer beyond the float range
            raise _err(f"loss_fn_config.{k}", "is out of the float range") from exc
    forward_only = bool(obj.get("forward_only", inner.get("forward_only", False)))
    images = ImageCounter(counts, assets)
    batch = _pack([_json_datum(i, d, images) for i, d in enumerate(data)])
    provenance = collect([provenance_from_json(i, d) for i, d in enumerate(data)], counts)  # datums: dicts (checked)
    batch = replace(batch, images=images.images(room))  # pointed files are read last, once the rest is valid
    return ForwardBackwardInput(model_id, seq_id, loss_fn, config, forward_only, batch, provenance)
