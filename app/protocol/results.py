"""forward_backward results on the wire: the protobuf ForwardBackwardOutput (one batched ArrayRecord) that the
trainer stores, and the JSON view of it that SDKs before protobuf results read."""

from __future__ import annotations

from typing import Any

import numpy as np

from app.errors import ServerError
from app.protocol.proto import pb
from app.training_data.batch import ForwardBackwardResult


def _output_arrays(result: ForwardBackwardResult) -> dict[str, tuple[np.ndarray, int]]:
    """name -> (array in its wire dtype, proto dtype), checked against the offsets."""
    total = int(result.offsets[-1])
    out: dict[str, tuple[np.ndarray, int]] = {}
    for name, arr in result.outputs.items():
        if arr.shape[0] != total:
            raise ServerError(f"output {name} has {arr.shape[0]} rows but offsets cover {total}")
        if arr.dtype.kind in "iu":
            out[name] = (np.ascontiguousarray(arr, dtype="<i8"), pb.DTYPE_INT64)
        else:
            out[name] = (np.ascontiguousarray(arr, dtype="<f4"), pb.DTYPE_FLOAT32)
    return out


def encode_forward_backward_output(result: ForwardBackwardResult) -> bytes:
    """Serialize a result as a ``tinker_public.ForwardBackwardOutput`` with one batched ArrayRecord."""
    offsets = np.asarray(result.offsets, dtype=np.int64)
    msg = pb.ForwardBackwardOutput(loss_fn_output_type=result.loss_fn_output_type)
    record = msg.loss_fn_outputs.add(type_tag="ArrayRecord", num_datums=len(offsets) - 1)
    for name, (arr, dtype) in _output_arrays(result).items():
        row_bytes = int(np.prod(arr.shape[1:], dtype=np.int64)) * arr.itemsize
        bt = record.fields[name]
        bt.data = arr.tobytes()
        bt.offsets = (offsets * row_bytes).astype("<i8").tobytes()
        bt.dtype = dtype
        bt.trailing_shape.extend(int(s) for s in arr.shape[1:])
    for k, v in result.metrics.items():
        msg.metrics[k] = float(v)
    return msg.SerializeToString()


def forward_backward_output_to_json(result: ForwardBackwardResult) -> dict[str, Any]:
    """The JSON ForwardBackwardOutput older SDKs parse: one {name: TensorData} dict per datum."""
    arrays = _output_arrays(result)
    bounds = [(int(lo), int(hi)) for lo, hi in zip(result.offsets[:-1], result.offsets[1:])]
    outputs = [
        {
            name: {
                "data": arr[lo:hi].reshape(-1).tolist(),
                "dtype": "int64" if dtype == pb.DTYPE_INT64 else "float32",
                "shape": [hi - lo, *(int(s) for s in arr.shape[1:])],
            }
            for name, (arr, dtype) in arrays.items()
        }
        for lo, hi in bounds
    ]
    metrics = {k: float(v) for k, v in result.metrics.items()}
    return {"loss_fn_output_type": result.loss_fn_output_type, "loss_fn_outputs": outputs, "metrics": metrics}


def forward_backward_json_from_proto(payload: bytes) -> dict[str, Any]:
    """The JSON view of a stored ForwardBackwardOutput (written by encode_forward_backward_output), for
    SDKs that poll without ``Accept: application/x-protobuf``."""
    msg = pb.ForwardBackwardOutput.FromString(payload)
    outputs: dict[str, np.ndarray] = {}
    offsets = np.zeros(1, dtype=np.int64)
    for record in msg.loss_fn_outputs:
        for name, bt in sorted(record.fields.items()):  # map order differs between processes
            dtype = np.dtype("<i8") if bt.dtype == pb.DTYPE_INT64 else np.dtype("<f4")
            trailing = tuple(int(t) for t in bt.trailing_shape)
            row_bytes = int(np.prod(trailing, dtype=np.int64)) * dtype.itemsize
            outputs[name] = np.frombuffer(bt.data, dtype=dtype).reshape(-1, *trailing)
            offsets = np.frombuffer(bt.offsets, dtype="<i8") // row_bytes
    result = ForwardBackwardResult(
        offsets=offsets,
        outputs=outputs,
        metrics=dict(sorted(msg.metrics.items())),
        loss_fn_output_type=msg.loss_fn_output_type,
    )
    return forward_backward_output_to_json(result)
