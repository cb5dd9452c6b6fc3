"""Anthropic-compatible routes: /v1/messages (streamed or not) and /v1/messages/count_tokens on a base model or a
tinker:// checkpoint the caller may read, under the same checks as /v1/chat/completions (app.api.v1_sampling). The
base model's Sampler answers through vLLM's Anthropic serving layer (app.sampling.openai); errors take Anthropic's
shape (app.api.error_responses)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict

from app.api.deps import ServicesDep, UserDep
from app.api.openai import Count, Words
from app.api.v1_sampling import check_budget, relay, served_model, text_size
from app.protocol.field_limits import Limit
from app.protocol.wire import Int64, TinkerPath

router = APIRouter(prefix="/v1")

# tools the sampler may compile into a grammar (tool_choice "any" or "tool"): bounded as a structured output
Tools = Annotated[list[dict[str, Any]], Limit("max_structured_output_bytes", "json_bytes")]
Json = Annotated[dict[str, Any], Limit("max_structured_output_bytes", "json_bytes")]  # output_config: a JSON schema


class _Conversation(BaseModel):
    """The fields the ingress checks; every other field goes to vLLM as sent (its Anthropic request models validate
    the whole body). The conversation is capped by limits.max_sample_request_bytes, its tokens by the context."""

    model_config = ConfigDict(extra="allow")

    model: TinkerPath  # a base model name or a tinker:// checkpoint path
    messages: list[dict[str, Any]]
    system: str | list[dict[str, Any]] | None = None
    tools: Tools | None = None
    output_config: Json | None = None

    def prompt_tokens(self) -> int:
        """The conversation's prompt tokens as charged to the token rate: one per UTF-8 byte (an upper bound)."""
        return text_size([part for part in (self.system, self.messages, self.tools) if part is not None])


class MessagesRequest(_Conversation):
    max_tokens: Count  # checked against limits.max_sample_tokens
    stop_sequences: Words | None = None
    stream: bool = False
    temperature: float | None = None  # checked with asample's ranges (app.sampling.params)
    top_k: Int64 | None = None
    top_p: float | None = None


class CountTokensRequest(_Conversation):
    pass


@router.post("/messages")
async def messages(body: MessagesRequest, services: ServicesDep, user: UserDep) -> Any:
    """Anthropic's Messages API (the `anthropic` client's `messages.create`, streamed or not): the reply of a base
    model or a tinker:// checkpoint to a conversation rendered with the model's chat template."""
    base_model, adapter_location = await served_model(services, body.model, user)
    sampling = (body.temperature, body.top_k, body.top_p)
    check_budget(services, user, base_model, sampling, "max_tokens", body.max_tokens, 1, body.prompt_tokens())
    return await relay(services, user, base_model, adapter_location, "messages", body.model_dump(exclude_unset=True))


@router.post("/messages/count_tokens")
async def count_tokens(body: CountTokensRequest, services: ServicesDep, user: UserDep) -> Any:
    """Anthropic's token count (`messages.count_tokens`): the conversation's tokens as the model's chat template
    renders them (`input_tokens`)."""
    base_model, adapter_location = await served_model(services, body.model, user)
    payload = body.model_dump(exclude_unset=True)
    return await relay(services, user, base_model, adapter_location, "count_tokens", payload)
