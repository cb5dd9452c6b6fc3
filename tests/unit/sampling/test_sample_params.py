"""asample validation: limits and ranges, each failure naming its field; stop semantics."""

from __future__ import annotations

import pytest

from app.config import LimitsConfig
from app.errors import LimitExceeded, UserError
from app.protocol.wire import SampleRequest
from app.sampling.params import sample_args
from app.training_data.validation import ModelLimits

LIMITS = LimitsConfig(max_num_samples=8, max_sample_tokens=32, default_sample_tokens=16, max_topk_logprobs=5)
MODEL = ModelLimits(vocab_size=100, max_context_length=40)


def request(**overrides) -> SampleRequest:
    body = {
        "sampling_session_id": "s:sample:0",
        "seq_id": 0,
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2, 3]}]},
        "sampling_params": {"temperature": 1.0, "top_k": -1, "top_p": 1.0},
    }
    params = overrides.pop("sampling_params", {})
    body["sampling_params"].update(params)
    body.update(overrides)
    return SampleRequest.model_validate(body)


def test_defaults_and_stop_forms() -> None:
    args = sample_args(request(), LIMITS, MODEL)
    assert args.prompt == (1, 2, 3) and args.max_tokens == 16 and args.num_samples == 1
    assert (args.stop_strings, args.stop_token_ids, args.ignore_eos) == ((), (), False)
    assert sample_args(request(sampling_params={"stop": []}), LIMITS, MODEL).ignore_eos
    assert sample_args(request(sampling_params={"stop": "\n"}), LIMITS, MODEL).stop_strings == ("\n",)
    assert sample_args(request(sampling_params={"stop": [7, 9]}), LIMITS, MODEL).stop_token_ids == (7, 9)
    assert sample_args(request(sampling_params={"seed": -1}), LIMITS, MODEL).seed == 2**63 - 1


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"num_samples": 9}, "num_samples"),
        ({"num_samples": 0}, "num_samples"),
        ({"sampling_params": {"max_tokens": 33}}, "sampling_params.max_tokens"),
        ({"sampling_params": {"max_tokens": -1}}, "sampling_params.max_tokens"),
        (
            {
                "prompt": {"chunks": [{"type": "encoded_text", "tokens": list(range(30))}]},
                "sampling_params": {"max_tokens": 20},
            },
            "sampling_params.max_tokens",
        ),
        ({"prompt": {"chunks": [{"type": "encoded_text", "tokens": [1] * 40}]}}, "prompt"),
        ({"prompt": {"chunks": [{"type": "encoded_text", "tokens": [100]}]}}, "prompt"),
        ({"prompt": {"chunks": [{"type": "image", "data": "", "format": "png"}]}}, "prompt.chunks[0]"),
        (
            {"prompt": {"chunks": [{"type": "encoded_text", "tokens": [1]}, {"type": "dmel", "dmel": ""}]}},
            "prompt.chunks[1]",
        ),
        ({"prompt": {"chunks": []}}, "prompt.chunks"),
        ({"topk_prompt_logprobs": 6}, "topk_prompt_logprobs"),
        ({"topk_sample_logprobs": -1}, "topk_sample_logprobs"),
        ({"prompt_alt_tokens_k": 1}, "prompt_alt_tokens_k"),
        ({"prompt_logprobs_last_n": 2}, "prompt_logprobs_last_n"),
        ({"sampling_params": {"temperature": -0.5}}, "sampling_params.temperature"),
        ({"sampling_params": {"top_k": 0}}, "sampling_params.top_k"),
        ({"sampling_params": {"top_p": 1.5}}, "sampling_params.top_p"),
        ({"sampling_params": {"stop": [500]}}, "sampling_params.stop"),
    ],
)
def test_bad_requests_name_their_field(overrides: dict, field: str) -> None:
    with pytest.raises(UserError) as info:
        sample_args(request(**overrides), LIMITS, MODEL)
    assert info.value.field == field


def test_limits_are_limit_errors() -> None:
    with pytest.raises(LimitExceeded):
        sample_args(request(num_samples=9), LIMITS, MODEL)
