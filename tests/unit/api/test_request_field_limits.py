"""Issue 45 #4 and #8 through the in-process app: a session search's words and terms, and what a sample asks the
sampler to check at every token (stop strings, bad words, biases) or compile (structured outputs), are bounded by
`limits` while the body is validated: a 400 naming the field and the limit, before anything is built. A request at
each limit gets past it (to the next check, or to its answer)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from app.config_sections import LimitsConfig
from app.protocol.wire import SampleRequest
from app.sampling.params import sample_args
from app.training_data.validation import ModelLimits
from tests.unit.api.conftest import BASE_MODEL, InProcessApi, new_session
from tests.unit.api.test_hostile_inputs import refused

SEARCH = "/api/v1/sessions/search"
LIMITS = LimitsConfig()


def _words(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))


def test_search_display_name_words_are_bounded(api: InProcessApi) -> None:
    body = refused(api.post(SEARCH, {"display_name": _words(1000)}), "display_name")  # 5.9 KB: was a 500
    assert "400" in body["error"]
    body = refused(api.post(SEARCH, {"display_name": _words(LIMITS.max_search_terms + 1)}), "display_name")
    assert "limits.max_search_terms=32" in body["error"]
    name = _words(LIMITS.max_search_terms)
    create = api.post("/api/v1/create_session", {"display_name": name})
    assert create.status_code == 200, create.text
    found = api.post(SEARCH, {"display_name": name})
    assert [s["display_name"] for s in found.json()["sessions"]] == [name]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"user_metadata": {f"k{i}": "v" for i in range(33)}}, "user_metadata"),
        ({"statuses": [{"type": "active"}] * 33}, "statuses"),
        ({"statuses": [{"type": "client_finished", "reasons": ["success"] * 9}]}, "statuses.0.reasons"),
        ({"owner": {"type": "user", "owner_urns": ["u" * 100] * 50}}, "owner"),
    ],
)
def test_search_terms_are_bounded(api: InProcessApi, body: dict, field: str) -> None:
    refused(api.post(SEARCH, body), field)
    new_session(api)
    at_limits = {"user_metadata": {f"k{i}": "v" for i in range(32)}, "statuses": [{"type": "active"}] * 32}
    answer = api.post(SEARCH, at_limits)
    assert answer.status_code == 200 and answer.json()["sessions"] == [], answer.text


def _sampling_session(api: InProcessApi) -> str:
    body = {"session_id": new_session(api), "sampling_session_seq_id": 0, "base_model": BASE_MODEL}
    response = api.post("/api/v1/create_sampling_session", body)
    assert response.status_code == 200, response.text
    return str(response.json()["sampling_session_id"])


def _asample(api: InProcessApi, stop: object, prompt: list[int]) -> dict:
    return {
        "sampling_session_id": _sampling_session(api),
        "seq_id": 0,
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": prompt}]},
        "sampling_params": {"max_tokens": 4, "stop": stop},
    }


@pytest.mark.parametrize(
    ("stop", "limit"),
    [
        (["x"] * 1_000_000, "limits.max_stop_sequences=64"),  # 5 MB, was accepted
        ([f"{i}" for i in range(65)], "limits.max_stop_sequences=64"),
        (list(range(65)), "limits.max_stop_sequences=64"),
        ("s" * 4097, "limits.max_stop_chars=4096"),
        (["s" * 2048, "t" * 2049], "limits.max_stop_chars=4096"),
    ],
)
def test_asample_stop_is_bounded(api: InProcessApi, stop: object, limit: str) -> None:
    body = refused(api.post("/api/v1/asample", _asample(api, stop, [1, 2])), "sampling_params.stop")
    assert limit in body["error"]


def test_asample_stop_at_the_limits_gets_past_them(api: InProcessApi) -> None:
    stops = ["s" * 64] * 64  # 64 strings, 4096 characters
    refused(api.post("/api/v1/asample", _asample(api, [*stops, "s"], [1, 2])), "sampling_params.stop")
    bad_prompt = _asample(api, stops, [10**9])  # then refused at the next check
    refused(api.post("/api/v1/asample", bad_prompt), "prompt")
    args = sample_args(SampleRequest.model_validate(_asample(api, stops, [1, 2])), LIMITS, ModelLimits(100, 64))
    assert args.stop_strings == tuple(stops)


def test_the_apps_own_limits_are_in_force(make_api: Callable[..., InProcessApi]) -> None:
    api = make_api(max_stop_sequences=2)
    body = refused(api.post("/api/v1/asample", _asample(api, ["a", "b", "c"], [1, 2])), "sampling_params.stop")
    assert "limits.max_stop_sequences=2" in body["error"]


def test_asample_prompt_chunks_are_counted_before_they_are_read(api: InProcessApi) -> None:
    body = _asample(api, None, [1])
    body["prompt"]["chunks"] *= 100_000
    refused(api.post("/api/v1/asample", body), "prompt.chunks")


@pytest.mark.parametrize(
    ("extra", "field", "limit"),
    [
        ({"stop": ["x"] * 65}, "stop", "max_stop_sequences"),
        ({"stop": "x" * 4097}, "stop", "max_stop_chars"),
        ({"stop_token_ids": list(range(65))}, "stop_token_ids", "max_stop_sequences"),
        ({"bad_words": ["w"] * 65}, "bad_words", "max_stop_sequences"),
        ({"bad_words": ["w" * 4097]}, "bad_words", "max_stop_chars"),
        ({"logit_bias": {str(i): 1.0 for i in range(1025)}}, "logit_bias", "max_logit_bias_entries"),
        ({"allowed_token_ids": list(range(1025))}, "allowed_token_ids", "max_logit_bias_entries"),
        ({"guided_regex": "a" * 65_537}, "guided_regex", "max_structured_output_bytes"),
        ({"guided_grammar": "a" * 65_537}, "guided_grammar", "max_structured_output_bytes"),
        ({"guided_choice": ["a" * 1000] * 66}, "guided_choice", "max_structured_output_bytes"),
        ({"guided_json": {"enum": ["a" * 1000] * 66}}, "guided_json", "max_structured_output_bytes"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"enum": ["a" * 1000] * 66}}}},
            "response_format",
            "max_structured_output_bytes",
        ),
        ({"structured_outputs": {"regex": "a" * 65_537}}, "structured_outputs", "max_structured_output_bytes"),
    ],
)
def test_openai_extension_fields_are_bounded(api: InProcessApi, extra: dict, field: str, limit: str) -> None:
    completion = {"model": BASE_MODEL, "prompt": "hi", "max_tokens": 4, **extra}
    assert f"limits.{limit}=" in refused(api.post("/v1/completions", completion), field)["error"]["message"]
    chat = {"model": BASE_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **extra}
    refused(api.post("/v1/chat/completions", chat), field)


def test_openai_extension_fields_at_the_limits_get_past_them(api: InProcessApi) -> None:
    at_limits = {
        "stop": ["s" * 64] * 64,
        "stop_token_ids": list(range(64)),
        "bad_words": ["w" * 64] * 64,
        "logit_bias": {str(i): 1.0 for i in range(1024)},
        "guided_regex": "a" * 65_000,
        "temperature": 3,  # then refused at the next check
    }
    over = {**at_limits, "logit_bias": {str(i): 1.0 for i in range(1025)}}
    refused(api.post("/v1/completions", {"model": BASE_MODEL, "prompt": "hi", **over}), "logit_bias")
    refused(api.post("/v1/completions", {"model": BASE_MODEL, "prompt": "hi", **at_limits}), "temperature")


def test_metadata_over_its_bytes_is_refused_while_the_body_is_validated(api: InProcessApi) -> None:
    """Tags and user_metadata over limits.max_user_metadata_bytes (as JSON) are refused by the request models' bound
    (the routes check no second time)."""
    big = "x" * LIMITS.max_user_metadata_bytes
    for body, field in (({"tags": [big]}, "tags"), ({"user_metadata": {"k": big}}, "user_metadata")):
        body = refused(api.post("/api/v1/create_session", body), field)
        assert "limits.max_user_metadata_bytes" in body["error"], body
    save = {"model_id": "m", "seq_id": 1, "path": "p", "user_metadata": {"k": big}}
    assert "limits.max_user_metadata_bytes" in refused(api.post("/api/v1/save_weights", save), "user_metadata")["error"]
