"""/v1/messages and /v1/messages/count_tokens in process, over a sampler client that records what reaches it and
answers as scripted: the checks before the Sampler (model, ownership, limits, token rate), what is sent, and every
error in Anthropic's shape with its status."""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator, Callable
from typing import Any

import pytest

from app.sampling.openai import Answer, Route
from tests.unit.api.conftest import BASE_MODEL, InProcessApi, saved_checkpoint
from tests.unit.api.test_sample_admission import _HoldingSamplers

HI = [{"role": "user", "content": "hi"}]
STREAM = ["event: message_start\ndata: {}\n\n", "event: message_stop\ndata: {}\n\n"]


class _ScriptedSamplers(_HoldingSamplers):
    """Records each /v1 request (route, adapter location, body) and answers `answer`, or streams `lines`."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[tuple[Route, str | None, dict[str, Any]]] = []
        self.answer: Answer = (200, {"type": "message", "content": []})
        self.lines: list[str] = []

    async def openai(
        self, base_model: str, adapter_location: str | None, route: Route, body: dict[str, Any], user: str
    ) -> AsyncGenerator[Answer | str, None]:
        self.requests.append((route, adapter_location, body))
        try:
            if self.lines:
                for line in self.lines:
                    yield line
            else:
                yield self.answer
        finally:
            self.slots.release(base_model, user)


def _scripted(make_api: Callable[..., InProcessApi], **overrides: Any) -> tuple[InProcessApi, _ScriptedSamplers]:
    api = make_api(**overrides)
    samplers = api.services.samplers = _ScriptedSamplers()
    return api, samplers


def _message(**fields: Any) -> dict[str, Any]:
    return {"model": BASE_MODEL, "max_tokens": 4, "messages": HI, **fields}


def _refused(response: Any, status: int, kind: str, *words: str) -> str:
    """The message of an error answer in Anthropic's shape, checked for its status, type and `words`."""
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and set(body) == {"type", "error"}, body
    assert body["error"]["type"] == kind and set(body["error"]) == {"type", "message"}, body
    for word in words:
        assert word in body["error"]["message"], body
    return str(body["error"]["message"])


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"max_tokens": None}, ["max_tokens"]),
        ({"max_tokens": 10**6}, ["max_tokens", "limits.max_sample_tokens="]),
        ({"max_tokens": 0}, ["max_tokens"]),
        ({"stop_sequences": ["x"] * 65}, ["stop_sequences", "limits.max_stop_sequences="]),
        ({"stop_sequences": ["x" * 4097]}, ["stop_sequences", "limits.max_stop_chars="]),
        ({"temperature": -1.0}, ["temperature", "limits.max_sample_temperature="]),
        ({"top_p": 0.0}, ["top_p"]),
        ({"top_k": 10**6}, ["top_k"]),
        ({"messages": None}, ["messages"]),
        ({"tools": [{"name": "t", "input_schema": {"enum": ["a" * 1000] * 66}}]}, ["tools", "limits.max_structure"]),
        ({"output_config": {"format": {"schema": {"enum": ["a" * 1000] * 66}}}}, ["output_config"]),
    ],
)
def test_bad_fields_are_400s_naming_the_field_and_limit_before_the_sampler(
    make_api: Callable[..., InProcessApi], fields: dict[str, Any], words: list[str]
) -> None:
    api, samplers = _scripted(make_api)
    body = {name: value for name, value in _message(**fields).items() if value is not None}
    _refused(api.post("/v1/messages", body), 400, "invalid_request_error", *words)
    assert samplers.requests == [] and samplers.slots.held(BASE_MODEL) == 0


def test_a_message_goes_to_the_sampler_as_sent(make_api: Callable[..., InProcessApi]) -> None:
    api, samplers = _scripted(make_api)
    body = _message(system="be brief", stop_sequences=["\n"], temperature=0, metadata={"user_id": "u"})
    answer = api.post("/v1/messages", body)
    assert answer.status_code == 200 and answer.json() == samplers.answer[1]
    assert samplers.requests == [("messages", None, body)]  # undeclared fields (metadata) too: vLLM validates them
    assert samplers.slots.held(BASE_MODEL) == 0  # the admission ended with the answer


def test_count_tokens_goes_to_the_sampler_without_a_budget(make_api: Callable[..., InProcessApi]) -> None:
    api, samplers = _scripted(make_api)
    samplers.answer = (200, {"input_tokens": 7})
    body = {"model": BASE_MODEL, "messages": HI, "system": "s"}
    assert api.post("/v1/messages/count_tokens", body).json() == {"input_tokens": 7}
    assert samplers.requests == [("count_tokens", None, body)]
    _refused(api.post("/v1/messages/count_tokens", {"model": BASE_MODEL}), 400, "invalid_request_error", "messages")


def test_a_checkpoint_is_sent_with_its_adapter_and_another_users_looks_missing(
    make_api: Callable[..., InProcessApi],
) -> None:
    api, samplers = _scripted(make_api)
    path = saved_checkpoint(api, "alice")
    assert api.post("/v1/messages", _message(model=path.uri)).status_code == 200
    ((_, location, _),) = samplers.requests
    assert location is not None
    missing_id = f"{uuid.uuid4().hex}:train:0"
    missing = path.uri.replace(path.model_id, missing_id)
    answers = [
        _refused(api.post(route, _message(model=model), "bob"), 404, "not_found_error", "model").replace(
            model_id, "<ID>"
        )
        for model, model_id in ((path.uri, path.model_id), (missing, missing_id))
        for route in ("/v1/messages", "/v1/messages/count_tokens")
    ]
    assert answers[:2] == answers[2:]
    _refused(api.post("/v1/messages", _message(model="no/such-model")), 404, "not_found_error", "model")
    assert len(samplers.requests) == 1


def test_the_samplers_error_answer_takes_anthropics_shape(make_api: Callable[..., InProcessApi]) -> None:
    api, samplers = _scripted(make_api)
    samplers.answer = (400, {"error": {"message": "messages.0.role: bad role", "type": "BadRequestError", "code": 400}})
    _refused(api.post("/v1/messages", _message()), 400, "invalid_request_error", "messages.0.role: bad role")


def test_a_stream_is_passed_on_as_it_is(make_api: Callable[..., InProcessApi]) -> None:
    api, samplers = _scripted(make_api)
    samplers.lines = STREAM
    answer = api.post("/v1/messages", _message(stream=True))
    assert answer.headers["content-type"].startswith("text/event-stream")
    assert answer.text == "".join(STREAM)
    assert samplers.requests[0][2]["stream"] is True


def test_the_prompt_and_budget_are_charged_to_the_token_rate(make_api: Callable[..., InProcessApi]) -> None:
    api, samplers = _scripted(make_api, sample_tokens_per_minute_per_user=100)
    # "hi", "user", the keys' values and the budget: well under 100
    assert api.post("/v1/messages", _message(max_tokens=40)).status_code == 200
    over = _message(system="s" * 60, max_tokens=40)
    _refused(api.post("/v1/messages", over), 400, "invalid_request_error", "quotas.sample_tokens_per_minute_per_user")
    _refused(api.post("/v1/messages", _message(max_tokens=80)), 429, "rate_limit_error", "retry in")
    assert len(samplers.requests) == 1


def test_keys_in_x_api_key_or_bearer_and_none_is_an_authentication_error(api: InProcessApi) -> None:
    api.services.samplers = _ScriptedSamplers()
    assert api.post("/v1/messages", _message(), headers={"X-API-Key": "tml-alice"}).status_code == 200
    bearer = {"X-API-Key": "", "Authorization": "Bearer tml-alice"}
    assert api.post("/v1/messages", _message(), headers=bearer).status_code == 200
    none = api.client.post("/v1/messages/count_tokens", json={"model": BASE_MODEL, "messages": HI})
    _refused(none, 401, "authentication_error", "X-API-Key")


def test_a_body_over_the_sampling_bytes_is_refused_unread_in_anthropics_shape(
    make_api: Callable[..., InProcessApi],
) -> None:
    api, samplers = _scripted(make_api, max_sample_request_bytes=4096, max_control_request_bytes=1024)
    assert api.post("/v1/messages", _message(system="s" * 2000)).status_code == 200  # a sampling route's bytes
    big = _message(system="s" * 5000)
    for route in ("/v1/messages", "/v1/messages/count_tokens"):
        _refused(api.post(route, big), 413, "request_too_large", "limits.max_sample_request_bytes=4096")
    assert len(samplers.requests) == 1
