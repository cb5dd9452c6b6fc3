"""SampleResponse encoding, read back by the SDK's own decoder, and its JSON view."""

from __future__ import annotations

import math

import pytest
from tinker.proto.response_conv import deserialize_sample_response

from app.sampling.response import SampledSequence, SampleResult, encode_sample_response, sample_json_from_proto

RESULT = SampleResult(
    sequences=[
        SampledSequence(
            tokens=[5, 6, 7],
            logprobs=[-1.0, -2.0, -3.0],
            stop_reason="length",
            topk_logprobs=[[(5, -1.0), (9, -1.5)], [(8, -0.5)], [(7, -3.0), (1, -3.5)]],
        ),
        SampledSequence(tokens=[4], logprobs=[-0.25], stop_reason="stop", topk_logprobs=[[(4, -0.25), (2, -2.0)]]),
    ],
    prompt_logprobs=[None, -4.0, None, -2.5],
    topk_prompt_logprobs=[None, [(3, -1.0), (4, -2.0)], [(6, -0.5), (2, -0.75)], [(1, -1.0), (9, -1.25)]],
    prompt_cache_hit_tokens=2,
)


def test_the_sdk_decodes_every_field() -> None:
    decoded = deserialize_sample_response(encode_sample_response(RESULT, topk_prompt=2, topk_sample=2))
    assert [s.tokens for s in decoded.sequences] == [[5, 6, 7], [4]]
    assert [s.stop_reason for s in decoded.sequences] == ["length", "stop"]
    assert decoded.sequences[0].logprobs == pytest.approx([-1.0, -2.0, -3.0])
    assert decoded.prompt_logprobs[0] is None and decoded.prompt_logprobs[2] is None
    assert decoded.prompt_logprobs[1] == pytest.approx(-4.0)
    assert decoded.topk_prompt_logprobs[0] is None
    assert decoded.topk_prompt_logprobs[1] == [(3, -1.0), (4, -2.0)]
    assert decoded.sequences[0].topk_logprobs[1] == [(8, -0.5)]  # the empty cell is trimmed
    assert decoded.prompt_cache_hit_tokens == 2


def test_topk_is_left_out_when_not_requested() -> None:
    decoded = deserialize_sample_response(encode_sample_response(RESULT))
    assert decoded.topk_prompt_logprobs is None and decoded.sequences[0].topk_logprobs is None


def test_json_view_matches_the_proto() -> None:
    body = sample_json_from_proto(encode_sample_response(RESULT, topk_prompt=2, topk_sample=2))
    assert body["sequences"][1] == {
        "stop_reason": "stop",
        "tokens": [4],
        "logprobs": [-0.25],
        "topk_logprobs": [[(4, -0.25), (2, -2.0)]],
    }
    assert body["prompt_logprobs"][0] is None and not math.isnan(body["prompt_logprobs"][1])
    assert body["topk_prompt_logprobs"][0] is None
