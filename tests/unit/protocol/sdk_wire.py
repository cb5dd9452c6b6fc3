"""Request bodies as the tinker SDK builds them, shared by the codec's tests."""

from __future__ import annotations

from typing import Any

from tinker import types
from tinker.types._pydantic_types.forward_backward_input import ForwardBackwardInput as PydFBInput


def legacy_json_input(data: list[types.Datum], loss_fn: str, loss_fn_config: dict[str, Any] | None) -> dict:
    """The `forward_backward_input` of the JSON body older SDKs send, built with the SDK's pydantic models."""
    return PydFBInput(
        data=[
            {
                "model_input": d.model_input,
                "loss_fn_inputs": {
                    k: {
                        "data": v.data,
                        "dtype": v.dtype,
                        "shape": v.shape,
                        "sparse_crow_indices": v.sparse_crow_indices,
                        "sparse_col_indices": v.sparse_col_indices,
                    }
                    for k, v in d.loss_fn_inputs.items()
                },
            }
            for d in data
        ],
        loss_fn=loss_fn,
        loss_fn_config=loss_fn_config,
    ).model_dump(mode="json", exclude_none=True)
