"""Provenance spans on the wire: the SDK's protobuf (Datum.with_provenance) and the proto3 JSON form decode to the
same Provenance; malformed spans are user errors naming the field."""

from __future__ import annotations

import json

import pytest
from tinker import types
from tinker.proto import request_conv

from app.errors import UserError
from app.protocol.codec import decode_forward_backward
from app.training_data.batch import Provenance, Span

MAX = 1 << 20


def _datum() -> types.Datum:
    d = types.Datum(
        model_input=types.ModelInput.from_ints([1, 40, 41, 7, 8]),
        loss_fn_inputs={"target_tokens": [40, 41, 7, 8, 9], "advantages": [0.0, 0.0, 1.0, 1.0, 1.0]},
    )
    return d.with_provenance(
        model_input=[
            types.PromptProvenanceSpan(sequence_id="r:0", length=3),
            types.SampledProvenanceSpan(sequence_id="r:0", length=2),
        ],
        loss_fn_inputs=[
            types.PromptProvenanceSpan(sequence_id="r:0", offset=1, length=2),
            types.SampledProvenanceSpan(sequence_id="r:0", length=3),
        ],
    )


WANT = Provenance(
    (Span(False, "r:0", 0, 3), Span(True, "r:0", 0, 2)), (Span(False, "r:0", 1, 2), Span(True, "r:0", 0, 3))
)


def _json_body(spans: dict) -> bytes:
    datum = {
        "model_input": {"chunks": [{"type": "encoded_text", "tokens": [1, 40, 41, 7, 8]}]},
        "loss_fn_inputs": {
            "target_tokens": {"data": [40, 41, 7, 8, 9], "dtype": "int64"},
            "advantages": {"data": [0, 0, 1, 1, 1], "dtype": "float32"},
        },
        **spans,
    }
    body = {
        "model_id": "s:train:0",
        "seq_id": 1,
        "forward_backward_input": {"data": [datum], "loss_fn": "stable_reinforce"},
    }
    return json.dumps(body).encode()


def test_sdk_protobuf_spans_decode() -> None:
    fbi = types.ForwardBackwardInput(
        data=[
            _datum(),
            types.Datum(
                model_input=types.ModelInput.from_ints([3]), loss_fn_inputs={"target_tokens": [4], "advantages": [0.0]}
            ),
        ],
        loss_fn="stable_reinforce",
    )
    req = types.ForwardBackwardRequest(forward_backward_input=fbi, model_id="s:train:0", seq_id=1)
    body = request_conv.forward_backward_request_to_proto(req).SerializeToString()
    decoded = decode_forward_backward(body, "application/x-protobuf", None, max_body_bytes=MAX)
    assert decoded.provenance == (WANT, None)


def test_json_spans_decode_like_protobuf() -> None:
    spans = {
        "model_input_spans": [
            {"prompt_tokens": {"sequence_id": "r:0", "length": 3}},
            {"sampled_tokens": {"sequence_id": "r:0", "length": 2}},
        ],
        "loss_fn_input_spans": [
            {"prompt_tokens": {"sequence_id": "r:0", "offset": 1, "length": 2}},
            {"sampled_tokens": {"sequence_id": "r:0", "length": 3}},
        ],
    }
    assert decode_forward_backward(_json_body(spans), "application/json", None, max_body_bytes=MAX).provenance == (
        WANT,
    )
    assert decode_forward_backward(_json_body({}), "application/json", None, max_body_bytes=MAX).provenance == ()


@pytest.mark.parametrize(
    ("spans", "field"),
    [
        (
            {"model_input_spans": [{"prompt_tokens": {"sequence_id": "r:0", "length": 5}}]},
            "data[0].loss_fn_input_spans",
        ),  # one list without its pair
        ({"model_input_spans": [{"other": {}}], "loss_fn_input_spans": []}, "data[0].model_input_spans[0]"),
        (
            {"model_input_spans": [{"sampled_tokens": {"sequence_id": "", "length": 1}}], "loss_fn_input_spans": []},
            "data[0].model_input_spans[0].sequence_id",
        ),
        (
            {"model_input_spans": [], "loss_fn_input_spans": [{"sampled_tokens": {"sequence_id": "r", "length": -1}}]},
            "data[0].loss_fn_input_spans[0].length",
        ),
        ({"model_input_spans": "r:0", "loss_fn_input_spans": []}, "data[0].model_input_spans"),
    ],
)
def test_malformed_spans_name_the_field(spans: dict, field: str) -> None:
    with pytest.raises(UserError) as info:
        decode_forward_backward(_json_body(spans), "application/json", None, max_body_bytes=MAX)
    assert info.value.field == field
