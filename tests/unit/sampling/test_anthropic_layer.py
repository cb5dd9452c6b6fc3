"""The Sampler's side of /v1/messages (app.sampling.openai.OpenAIServer) over stand-ins of vLLM's handlers: the body
validated by vLLM's Anthropic request models before any handler runs, the adapter named under a one-request key,
and the answers serialized as vLLM's Anthropic router does (no null fields)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from vllm.entrypoints.anthropic.protocol import (
    AnthropicContentBlock,
    AnthropicCountTokensRequest,
    AnthropicCountTokensResponse,
    AnthropicMessagesRequest,
    AnthropicMessagesResponse,
    AnthropicUsage,
)
from vllm.lora.request import LoRARequest

from app.sampling.openai import OpenAIServer, Route

ADAPTER = LoRARequest("checkpoint", 7, "/adapters/7")
BODY = {"model": "tinker://m/sampler_weights/a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


class _Models:
    def __init__(self) -> None:
        self.lora_requests: dict[str, LoRARequest] = {}


class _Handler:
    """Stands in for vLLM's AnthropicServingMessages: notes the model each request names and the adapter under it."""

    def __init__(self, models: _Models) -> None:
        self.models = models
        self.seen: list[tuple[str, str, LoRARequest]] = []

    def _note(self, kind: str, request: Any) -> None:
        self.seen.append((kind, request.model, self.models.lora_requests[request.model]))

    async def create_messages(self, request: AnthropicMessagesRequest) -> AnthropicMessagesResponse:
        self._note("messages", request)
        text = AnthropicContentBlock(type="text", text="ok")
        return AnthropicMessagesResponse(
            id="msg_1", content=[text], model="m", usage=AnthropicUsage(input_tokens=3, output_tokens=1)
        )

    async def count_tokens(self, request: AnthropicCountTokensRequest) -> AnthropicCountTokensResponse:
        self._note("count_tokens", request)
        return AnthropicCountTokensResponse(input_tokens=3)


def _server() -> tuple[OpenAIServer, _Models, _Handler]:
    models = _Models()
    handler = _Handler(models)
    return OpenAIServer(cast(Any, models), cast(Any, None), cast(Any, handler)), models, handler


def _respond(server: OpenAIServer, route: Route, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    answer = asyncio.run(server.respond(route, body, ADAPTER))
    assert isinstance(answer, tuple)
    return answer


def test_a_message_reaches_the_handler_with_its_adapter_and_answers_without_nulls() -> None:
    server, models, handler = _server()
    status, body = _respond(server, "messages", BODY)
    assert status == 200
    assert body["content"] == [{"type": "text", "text": "ok"}]  # the block's null fields left out too
    assert "stop_reason" not in body and "kv_transfer_params" not in body and None not in body.values()
    ((kind, key, adapter),) = handler.seen
    assert kind == "messages" and key.startswith("request-")
    assert (adapter.lora_name, adapter.lora_int_id, adapter.lora_path) == (BODY["model"], 7, "/adapters/7")
    assert models.lora_requests == {}  # the one-request key is gone


def test_count_tokens_reaches_its_handler() -> None:
    server, _, handler = _server()
    count = {name: value for name, value in BODY.items() if name != "max_tokens"}
    assert _respond(server, "count_tokens", count) == (200, {"input_tokens": 3})
    assert [kind for kind, _, _ in handler.seen] == ["count_tokens"]


def test_a_body_vllm_refuses_is_a_400_naming_the_field_before_any_handler() -> None:
    server, _, handler = _server()
    for route, body, field in (
        ("messages", {**BODY, "messages": [{"role": "robot", "content": "x"}]}, "messages"),
        ("messages", {**BODY, "max_tokens": None}, "max_tokens"),
        ("count_tokens", {"model": "m"}, "messages"),
    ):
        status, answer = _respond(server, cast(Route, route), body)
        assert status == 400 and field in answer["error"]["message"] and field in answer["error"]["param"], answer
    assert handler.seen == []
