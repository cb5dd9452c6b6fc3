"""vLLM's own OpenAI serving layer (models, completions, chat) and its Anthropic Messages layer (messages,
count_tokens: Anthropic requests converted to chat requests, answers back) over the sampler's engine.

Each request names its adapter through the serving layer's model table: the request's model is swapped for a
one-request key under which our LoRARequest sits (renamed to the model the caller asked for, so responses echo
it), and the key goes as soon as vLLM has resolved it. Base-model requests get the all-zero adapter, as on the
Tinker path (app.sampling.engine).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, cast

from pydantic import BaseModel, ValidationError

if TYPE_CHECKING:
    from vllm.entrypoints.anthropic.protocol import AnthropicCountTokensRequest, AnthropicMessagesRequest
    from vllm.entrypoints.anthropic.serving import AnthropicServingMessages
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion
    from vllm.entrypoints.openai.models.serving import OpenAIServingModels
    from vllm.lora.request import LoRARequest
    from vllm.v1.engine.async_llm import AsyncLLM

    Request: TypeAlias = (
        CompletionRequest | ChatCompletionRequest | AnthropicMessagesRequest | AnthropicCountTokensRequest
    )  # the request model of a route

Route = Literal["completions", "chat", "messages", "count_tokens"]
ANTHROPIC_ROUTES: frozenset[Route] = frozenset({"messages", "count_tokens"})
Answer = tuple[int, dict[str, Any]]  # (HTTP status, JSON body); an error's in OpenAI's shape on every route


class OpenAIServer:
    def __init__(
        self, models: OpenAIServingModels, completion: OpenAIServingCompletion, chat: AnthropicServingMessages
    ):
        self._models = models
        self._completion = completion
        self._chat = chat

    @classmethod
    def start(cls, llm: AsyncLLM, served_name: str) -> OpenAIServer:
        """The serving layer as vLLM's API server builds it, with the tokenizer's chat template. Model cards name
        the served name as their root, not a path on this machine. Chat is vLLM's Anthropic handler, which is its
        OpenAI chat handler with the Messages conversion on top."""
        from vllm.entrypoints.anthropic.serving import AnthropicServingMessages
        from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion
        from vllm.entrypoints.openai.models.protocol import BaseModelPath
        from vllm.entrypoints.openai.models.serving import OpenAIServingModels
        from vllm.renderers.online_renderer import OnlineRenderer

        models = OpenAIServingModels(llm, [BaseModelPath(name=served_name, model_path=served_name)])
        renderer = OnlineRenderer(
            llm.model_config,
            llm.renderer,
            request_logger=None,
            chat_template=None,
            chat_template_content_format="auto",
        )
        completion = OpenAIServingCompletion(llm, models, online_renderer=renderer, request_logger=None)
        chat = AnthropicServingMessages(
            llm,
            models,
            "assistant",
            online_renderer=renderer,
            request_logger=None,
            chat_template=None,
            chat_template_content_format="auto",
        )
        return cls(models, completion, chat)

    async def models(self) -> dict[str, Any]:
        """The base model's card (vLLM's /v1/models, without adapters: checkpoints are named by path)."""
        return (await self._models.registry.show_available_models()).model_dump()

    async def respond(self, route: Route, body: dict[str, Any], lora: LoRARequest) -> Answer | AsyncIterator[str]:
        """The JSON answer, or the SSE lines of a streamed one, for a request body of `route` served by `lora`."""
        from vllm.entrypoints.serve import create_error_response
        from vllm.entrypoints.serve.engine.protocol import ErrorResponse
        from vllm.entrypoints.serve.exception_handling.handlers.validation import clean_loc_for_param
        from vllm.lora.request import LoRARequest

        try:
            request = cast("Request", _request_model(route).model_validate(body))
        except ValidationError as exc:
            param = clean_loc_for_param(tuple(exc.errors()[0]["loc"]))
            return _error(create_error_response(f"{param}: {exc.errors()[0]['msg']}", param=param))
        key = f"request-{uuid.uuid4().hex}"
        self._models.lora_requests[key] = LoRARequest(request.model or "", lora.lora_int_id, lora.lora_path)
        request.model = key
        result: AsyncIterator[str] | BaseModel
        try:
            result = await self._serve(route, request)
        except Exception as exc:  # noqa: BLE001 - answered as vLLM's API server does: its errors say their status
            result = create_error_response(exc)
        finally:
            del self._models.lora_requests[key]  # resolved: vLLM holds the LoRARequest itself from here on
        if isinstance(result, ErrorResponse):
            return _error(result)
        if isinstance(result, AsyncIterator):
            return result
        return 200, result.model_dump(exclude_none=route in ANTHROPIC_ROUTES)  # as vLLM's Anthropic router does

    async def _serve(self, route: Route, request: Any) -> Any:  # Any: the request model of `route`
        if route == "completions":
            return await self._completion.create_completion(request)
        if route == "chat":
            return await self._chat.create_chat_completion(request)
        if route == "messages":
            return await self._chat.create_messages(request)
        return await self._chat.count_tokens(request)


def _request_model(route: Route) -> type[BaseModel]:
    """vLLM's request model of `route`."""
    from vllm.entrypoints.anthropic.protocol import AnthropicCountTokensRequest, AnthropicMessagesRequest
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    models: dict[Route, type[BaseModel]] = {
        "completions": CompletionRequest,
        "chat": ChatCompletionRequest,
        "messages": AnthropicMessagesRequest,
        "count_tokens": AnthropicCountTokensRequest,
    }
    return models[route]


def _error(response: Any) -> Answer:
    return response.error.code, response.model_dump()
