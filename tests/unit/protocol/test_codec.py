"""Codec tests against the real tinker 0.38.0 SDK serialisers and deserialisers."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zstandard
from tinker import types
from tinker.proto import request_conv, response_conv
from tinker.proto import tinker_public_pb2 as pb

from app.errors import LimitExceeded, UserError
from app.protocol.codec import decode_forward_backward
from app.protocol.results import encode_forward_backward_output, forward_backward_output_to_json
from app.training_data.batch import IMAGE_PLACEHOLDER, ForwardBackwardResult
from tests.unit.protocol.sdk_wire import legacy_json_input

PROTO = "application/x-protobuf"
MAX = 1 << 24


def sdk_request(data, loss_fn="cross_entropy", config=None, seq_id=3) -> types.ForwardBackwardRequest:
    fbi = types.ForwardBackwardInput(data=data, loss_fn=loss_fn, loss_fn_config=config)
    return types.ForwardBackwardRequest(forward_backward_input=fbi, model_id="s:train:0", seq_id=seq_id)


def sdk_bytes(data, **kw) -> bytes:
    return request_conv.forward_backward_request_to_proto(sdk_request(data, **kw)).SerializeToString()


def datum(tokens, **inputs) -> types.Datum:
    return types.Datum(model_input=types.ModelInput.from_ints(tokens), loss_fn_inputs=inputs)


def decode(body: bytes, ct: str = PROTO, enc: str | None = None, max_body_bytes: int = MAX):
    return decode_forward_backward(body, ct, enc, max_body_bytes=max_body_bytes)


def two_datums():
    return [
        datum([1, 2, 3], target_tokens=[2, 3, 4], weights=[0.0, 1.0, 1.0]),
        datum([5, 6], target_tokens=[6, 7], weights=[1.0, 0.5]),
    ]


def check_two(fb):
    b = fb.batch
    assert b.tokens.dtype == np.int64 and b.tokens.tolist() == [1, 2, 3, 5, 6]
    assert b.offsets.tolist() == [0, 3, 5]
    assert b.loss_inputs["target_tokens"].dtype == np.int64
    assert b.loss_inputs["target_tokens"].tolist() == [2, 3, 4, 6, 7]
    assert b.loss_inputs["weights"].dtype == np.float32
    assert b.loss_inputs["weights"].tolist() == [0.0, 1.0, 1.0, 1.0, 0.5]


# ------------------------------------------------------------------------------------- proto decode


def test_proto_roundtrip_basic():
    fb = decode(sdk_bytes(two_datums(), config={"clip_low_threshold": 0.7, "loss_id": "abc"}))
    assert (fb.model_id, fb.seq_id, fb.loss_fn, fb.forward_only) == ("s:train:0", 3, "cross_entropy", False)
    assert fb.loss_fn_config == {"clip_low_threshold": pytest.approx(0.7), "loss_id": "abc"}
    check_two(fb)


def test_proto_zstd_and_multi_chunk():
    mi = types.ModelInput(chunks=[types.EncodedTextChunk(tokens=[1, 2]), types.EncodedTextChunk(tokens=[3])])
    d = types.Datum(model_input=mi, loss_fn_inputs={"target_tokens": [2, 3, 4], "weights": [1.0, 1.0, 1.0]})
    body = zstandard.ZstdCompressor().compress(sdk_bytes([d, *two_datums()[1:]]))
    fb = decode(body, enc="zstd")
    assert fb.batch.tokens.tolist() == [1, 2, 3, 5, 6]
    assert fb.batch.offsets.tolist() == [0, 3, 5]


def test_zstd_bomb_bounded():
    raw = sdk_bytes([datum([0] * 50_000, target_tokens=[0] * 50_000)])
    body = zstandard.ZstdCompressor().compress(raw)
    assert len(body) < 10_000 < len(raw)
    with pytest.raises(LimitExceeded) as ei:
        decode(body, enc="zstd", max_body_bytes=10_000)
    assert ei.value.field == "body"
    # A frame without a declared content size is bounded too.
    streamed = zstandard.ZstdCompressor(write_content_size=False).compressobj()
    body2 = streamed.compress(raw) + streamed.flush()
    with pytest.raises(LimitExceeded):
        decode(body2, enc="zstd", max_body_bytes=10_000)
    assert decode(body2, enc="zstd").batch.tokens.shape == (50_000,)


def test_raw_body_limit_and_bad_zstd():
    with pytest.raises(LimitExceeded):
        decode(sdk_bytes(two_datums()), max_body_bytes=10)
    with pytest.raises(UserError) as ei:
        decode(b"not zstd at all", enc="zstd")
    assert ei.value.field == "body"


def test_forward_only_and_legacy_config_fallback():
    msg = request_conv.forward_backward_request_to_proto(sdk_request(two_datums(), config={"beta": 0.05}))
    msg.forward_only = True
    msg.loss_fn_config_v2.clear()
    msg.loss_fn_config["beta"] = 0.25
    fb = decode(msg.SerializeToString())
    assert fb.forward_only is True and fb.loss_fn_config == {"beta": 0.25}


def test_v2_preferred_over_legacy():
    msg = request_conv.forward_backward_request_to_proto(sdk_request(two_datums(), config={"beta": 0.05}))
    msg.loss_fn_config["beta"] = 9.0
    assert decode(msg.SerializeToString()).loss_fn_config == {"beta": pytest.approx(0.05)}


def test_2d_dense_numpy():
    tt = np.arange(12, dtype=np.int64).reshape(4, 3)
    w = np.full((4, 3), 0.5, dtype=np.float32)
    d = [datum([1, 2, 3, 4], target_tokens=tt, weights=w), datum([5, 6], target_tokens=tt[:2], weights=w[:2])]
    fb = decode(sdk_bytes(d))
    assert fb.batch.loss_inputs["target_tokens"].shape == (6, 3)
    np.testing.assert_array_equal(fb.batch.loss_inputs["target_tokens"], np.concatenate([tt, tt[:2]]))
    assert fb.batch.loss_inputs["weights"].dtype == np.float32


def test_2d_sparse_csr_from_sdk_torch():
    torch = pytest.importorskip("torch")
    tt = torch.zeros((5, 8), dtype=torch.int64)
    tt[:, 0] = torch.tensor([11, 12, 13, 14, 15])
    w = torch.zeros((5, 8), dtype=torch.float32)
    w[:, 0] = 1.0
    w[2, 3] = 0.25
    d = datum([1, 2, 3, 4, 5], target_tokens=tt, weights=w)
    assert d.loss_fn_inputs["target_tokens"].sparse_crow_indices is not None  # the SDK chose CSR
    msg = request_conv.forward_backward_request_to_proto(sdk_request([d]))
    assert msg.data[0].loss_fn_inputs["weights"].WhichOneof("encoding") == "sparse_csr"
    fb = decode(msg.SerializeToString())
    np.testing.assert_array_equal(fb.batch.loss_inputs["target_tokens"], tt.numpy())
    np.testing.assert_array_equal(fb.batch.loss_inputs["weights"], w.numpy())


def test_2d_sparse_csr_built_directly():
    td = types.TensorData(
        data=[7, 9], dtype="int64", shape=[3, 2], sparse_crow_indices=[0, 1, 1, 2], sparse_col_indices=[1, 0]
    )
    fb = decode(sdk_bytes([datum([1, 2, 3], target_tokens=td)]))
    assert fb.batch.loss_inputs["target_tokens"].tolist() == [[0, 7], [0, 0], [9, 0]]


def test_int32_and_bf16_widening():
    msg = request_conv.forward_backward_request_to_proto(sdk_request(two_datums()[:1]))
    t = msg.data[0].loss_fn_inputs["target_tokens"]
    t.dtype, t.dense = pb.DTYPE_INT32, np.array([2, 3, 4], dtype="<i4").tobytes()
    w = msg.data[0].loss_fn_inputs["weights"]
    bf16 = (np.array([0.5, -2.0, 1.0], dtype="<f4").view("<u4") >> 16).astype("<u2")
    w.dtype, w.dense = pb.DTYPE_BFLOAT16, bf16.tobytes()
    fb = decode(msg.SerializeToString())
    assert fb.batch.loss_inputs["target_tokens"].dtype == np.int64
    assert fb.batch.loss_inputs["target_tokens"].tolist() == [2, 3, 4]
    assert fb.batch.loss_inputs["weights"].dtype == np.float32
    assert fb.batch.loss_inputs["weights"].tolist() == [0.5, -2.0, 1.0]


# --------------------------------------------------------------------------------------- JSON decode


def sdk_json(data, flat=False, **kw) -> bytes:
    fbi = legacy_json_input(data, "ppo", {"clip_low_threshold": 0.8, "mode": "x"})
    if flat:
        return json.dumps({"model_id": "s:train:0", "seq_id": 4, **fbi, "forward_only": True, **kw}).encode()
    return json.dumps({"model_id": "s:train:0", "seq_id": 4, "forward_backward_input": fbi, **kw}).encode()


@pytest.mark.parametrize("flat", [False, True])
def test_json_nested_and_flat(flat):
    fb = decode(sdk_json(two_datums(), flat=flat), ct="application/json; charset=utf-8")
    assert (fb.model_id, fb.seq_id, fb.loss_fn, fb.forward_only) == ("s:train:0", 4, "ppo", flat)
    assert fb.loss_fn_config == {"clip_low_threshold": 0.8, "mode": "x"}
    check_two(fb)


def test_json_sparse_and_2d():
    td = types.TensorData(
        data=[7, 9], dtype="int64", shape=[3, 2], sparse_crow_indices=[0, 1, 1, 2], sparse_col_indices=[1, 0]
    )
    w = np.ones((3, 2), dtype=np.float32)
    fb = decode(sdk_json([datum([1, 2, 3], target_tokens=td, weights=w)]), ct="application/json")
    assert fb.batch.loss_inputs["target_tokens"].tolist() == [[0, 7], [0, 0], [9, 0]]
    assert fb.batch.loss_inputs["weights"].shape == (3, 2)


def test_json_zstd():
    body = zstandard.ZstdCompressor().compress(sdk_json(two_datums()))
    check_two(decode(body, ct="application/json", enc="zstd"))


# -------------------------------------------------------------------------------------- validation


def proto_with(mutate, data=None) -> bytes:
    msg = request_conv.forward_backward_request_to_proto(sdk_request(data or two_datums()))
    mutate(msg)
    return msg.SerializeToString()


def expect_error(body: bytes, field: str, *words: str, ct: str = PROTO):
    with pytest.raises(UserError) as ei:
        decode(body, ct=ct)
    assert ei.value.field == field, ei.value.message
    assert field in ei.value.message
    for w in words:
        assert w in ei.value.message
    return ei.value


def test_error_length_mismatch():
    d = [*two_datums(), datum([1] * 8, target_tokens=[0] * 8, weights=[1.0] * 7)]
    e = expect_error(sdk_bytes(d), "data[2].loss_fn_inputs.weights")
    assert e.message == "data[2].loss_fn_inputs.weights has length 7 but model_input has 8 tokens"


def test_an_image_chunk_is_kept_whole_with_placeholders_at_its_positions():
    img = types.ImageChunk(data=b"\x89PNG", format="png", expected_tokens=2)
    d = types.Datum(
        model_input=types.ModelInput(chunks=[types.EncodedTextChunk(tokens=[1]), img]),
        loss_fn_inputs={"target_tokens": [1, 2, 3]},
    )
    for body, ct in ((sdk_bytes([d]), PROTO), (sdk_json([d]), "application/json")):
        batch = decode(body, ct=ct).batch
        assert batch.tokens.tolist() == [1, IMAGE_PLACEHOLDER, IMAGE_PLACEHOLDER]
        (image,) = batch.images
        assert (image.datum, image.position, image.tokens, image.format, image.data) == (0, 1, 2, "png", b"\x89PNG")
        assert image.field in ("data[0].model_input[1]", "data[0].model_input.chunks[1]")


def test_error_audio_and_image_chunks_without_their_token_count():
    d = types.Datum(
        model_input=types.ModelInput(chunks=[types.EncodedTextChunk(tokens=[1])]), loss_fn_inputs={"target_tokens": [1]}
    )
    expect_error(
        proto_with(lambda m: m.data[0].model_input.add().dmel.SetInParent(), [d]),
        "data[0].model_input[1]",
        "audio is not served",
    )
    expect_error(
        proto_with(lambda m: setattr(m.data[0].model_input.add().image, "data", b"x"), [d]),
        "data[0].model_input[1].expected_tokens",
        "is required",
    )


def test_error_empty_data():
    expect_error(sdk_bytes([]), "data", "empty")


def test_error_datums_disagree_on_keys_and_trailing_shape():
    expect_error(sdk_bytes([*two_datums(), datum([1], target_tokens=[2])]), "data[2].loss_fn_inputs", "weights")
    d = [
        datum([1, 2], target_tokens=np.zeros((2, 3), np.int64)),
        datum([1, 2], target_tokens=np.zeros((2, 4), np.int64)),
    ]
    expect_error(sdk_bytes(d), "data[1].loss_fn_inputs.target_tokens", "trailing shape")
    d = [datum([1, 2], target_tokens=np.zeros((2, 3), np.int64)), datum([1, 2], target_tokens=[0, 0])]
    expect_error(sdk_bytes(d), "data[1].loss_fn_inputs.target_tokens", "trailing shape")


def test_error_malformed_bodies():
    expect_error(b"\xff\xff\xff\xff", "body", "protobuf")
    expect_error(b"{not json", "body", "JSON", ct="application/json")


def test_error_bad_byte_lengths_and_shapes():
    def odd_bytes(m):
        m.data[1].loss_fn_inputs["weights"].dense = b"\x00" * 7

    expect_error(proto_with(odd_bytes), "data[1].loss_fn_inputs.weights", "multiple")

    def bad_shape(m):
        del m.data[0].loss_fn_inputs["weights"].shape[:]
        m.data[0].loss_fn_inputs["weights"].shape.extend([2, 2])

    expect_error(proto_with(bad_shape), "data[0].loss_fn_inputs.weights", "shape [2, 2]")

    def three_d(m):
        t = m.data[0].loss_fn_inputs["weights"]
        del t.shape[:]
        t.shape.extend([3, 1, 1])

    expect_error(proto_with(three_d), "data[0].loss_fn_inputs.weights", "(N, K)")

    def odd_tokens(m):
        m.data[0].model_input[0].encoded_text.tokens = b"\x01\x00\x00"

    expect_error(proto_with(odd_tokens), "data[0].model_input[0].tokens", "multiple")


def test_error_unknown_dtype():
    def unspecified(m):
        m.data[1].loss_fn_inputs["target_tokens"].dtype = pb.DTYPE_UNSPECIFIED

    expect_error(proto_with(unspecified), "data[1].loss_fn_inputs.target_tokens.dtype", "unknown")
    body = json.loads(sdk_json(two_datums()))
    body["forward_backward_input"]["data"][0]["loss_fn_inputs"]["weights"]["dtype"] = "float16"
    expect_error(json.dumps(body).encode(), "data[0].loss_fn_inputs.weights.dtype", "unknown", ct="application/json")


def test_error_bad_csr():
    td = types.TensorData(
        data=[7, 9], dtype="int64", shape=[3, 2], sparse_crow_indices=[0, 1, 1, 3], sparse_col_indices=[1, 0]
    )
    expect_error(sdk_bytes([datum([1, 2, 3], target_tokens=td)]), "data[0].loss_fn_inputs.target_tokens", "CSR")
    td = types.TensorData(data=[7], dtype="int64", shape=[3], sparse_crow_indices=[0, 1], sparse_col_indices=[0])
    expect_error(sdk_bytes([datum([1, 2, 3], target_tokens=td)]), "data[0].loss_fn_inputs.target_tokens", "2-D")
    td = types.TensorData(
        data=[7], dtype="int64", shape=[3, 10**9], sparse_crow_indices=[0, 1, 1, 1], sparse_col_indices=[0]
    )
    with pytest.raises(LimitExceeded) as ei:
        decode(sdk_bytes([datum([1, 2, 3], target_tokens=td)]))
    assert ei.value.field == "data[0].loss_fn_inputs.target_tokens"


def test_json_errors_name_fields():
    body = json.loads(sdk_json(two_datums()))
    body["forward_backward_input"]["data"][1]["model_input"]["chunks"].append(
        {"type": "image_asset_pointer", "location": "https://example.com/a.png", "format": "png"}
    )
    expect_error(
        json.dumps(body).encode(), "data[1].model_input.chunks[1].location", "fetches nothing", ct="application/json"
    )
    body = json.loads(sdk_json(two_datums()))
    body["forward_backward_input"]["data"][1]["loss_fn_inputs"]["weights"]["data"] = [1.0]
    body["forward_backward_input"]["data"][1]["loss_fn_inputs"]["weights"]["shape"] = [1]
    expect_error(json.dumps(body).encode(), "data[1].loss_fn_inputs.weights", "length 1", ct="application/json")


# --------------------------------------------------------------------------------------- encoding


def make_result():
    offsets = np.array([0, 3, 5], dtype=np.int64)
    lp = np.array([-0.5, -1.0, -1.5, -2.0, -2.5], dtype=np.float32)
    topk = np.arange(15, dtype=np.float32).reshape(5, 3) * -0.1
    return ForwardBackwardResult(offsets, {"logprobs": lp, "topk": topk}, {"loss:sum": 7.5, "tokens:sum": 5.0})


def test_output_roundtrips_through_sdk():
    res = make_result()
    out = response_conv.deserialize_forward_backward_output(encode_forward_backward_output(res))
    assert out.loss_fn_output_type == "ArrayRecord"
    assert out.metrics == {"loss:sum": 7.5, "tokens:sum": 5.0}
    assert len(out.loss_fn_outputs) == 2
    for i, (lo, hi) in enumerate([(0, 3), (3, 5)]):
        lp, topk = out.loss_fn_outputs[i]["logprobs"], out.loss_fn_outputs[i]["topk"]
        assert lp.shape == [hi - lo] and lp.dtype == "float32"
        np.testing.assert_array_equal(lp.to_numpy(), res.outputs["logprobs"][lo:hi])
        assert topk.shape == [hi - lo, 3]
        np.testing.assert_array_equal(topk.to_numpy(), res.outputs["topk"][lo:hi])


def test_output_wire_layout_and_empty():
    msg = pb.ForwardBackwardOutput()
    msg.ParseFromString(encode_forward_backward_output(make_result()))
    (rec,) = msg.loss_fn_outputs
    assert rec.num_datums == 2 and rec.type_tag == "ArrayRecord"
    assert np.frombuffer(rec.fields["topk"].offsets, "<i8").tolist() == [0, 36, 60]
    assert list(rec.fields["topk"].trailing_shape) == [3]
    empty = ForwardBackwardResult(np.array([0], np.int64), {"logprobs": np.zeros(0, np.float32)}, {"loss:sum": 0.0})
    out = response_conv.deserialize_forward_backward_output(encode_forward_backward_output(empty))
    assert out.loss_fn_outputs == [] and out.metrics == {"loss:sum": 0.0}


def test_output_json_parses_with_sdk_types():
    j = forward_backward_output_to_json(make_result())
    json.dumps(j)
    assert j["loss_fn_output_type"] == "ArrayRecord" and j["metrics"]["loss:sum"] == 7.5
    assert j["loss_fn_outputs"][1]["topk"]["shape"] == [2, 3]
    pyd_td = types._pydantic_types.tensor_data.TensorData
    topk = pyd_td.model_validate(j["loss_fn_outputs"][1]["topk"])
    np.testing.assert_array_equal(topk.to_numpy(), make_result().outputs["topk"][3:5])
    assert pyd_td.model_validate(j["loss_fn_outputs"][0]["logprobs"]).to_numpy().shape == (3,)


def test_truncated_or_padded_zstd_rejected():
    body = zstandard.ZstdCompressor().compress(sdk_bytes(two_datums()))
    for bad in (body[:-5], body + b"junk", b""):
        with pytest.raises(UserError) as ei:
            decode(bad, enc="zstd")
        assert ei.value.field == "body"


def test_stored_proto_output_renders_as_json_for_older_sdks() -> None:
    from app.protocol.results import forward_backward_json_from_proto

    offsets = np.array([0, 2, 5], dtype=np.int64)
    result = ForwardBackwardResult(
        offsets=offsets,
        outputs={"logprobs": np.arange(5, dtype=np.float32) - 5, "topk": np.arange(10, dtype=np.float32).reshape(5, 2)},
        metrics={"loss:sum": 3.5},
    )
    rendered = forward_backward_json_from_proto(encode_forward_backward_output(result))
    assert rendered == forward_backward_output_to_json(result)
    assert rendered["loss_fn_outputs"][1]["topk"]["shape"] == [3, 2]
    assert rendered["loss_fn_outputs"][0]["logprobs"]["data"] == [-5.0, -4.0]
