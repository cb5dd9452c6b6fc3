"""OpenAI-compatible routes: /v1/models, /v1/completions and /v1/chat/completions on a base model or a tinker://
checkpoint the caller may read. The ingress checks the model and the limits; the base model's Sampler answers
through vLLM's own OpenAI serving layer (app.sampling.openai), whose JSON or SSE stream is passed on as it is."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Annotated, Any, cast

from fastapi import APIRouter
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from app.api.deps import Services, ServicesDep, UserDep
from app.api.openai_images import check_images, image_parts
from app.api.quotas import admit_sample, check_sample_tokens
from app.api.sampling import adapter_of
from app.errors import LimitExceeded, NotFound, Relayed, UserError
from app.protocol.field_limits import Limit
from app.protocol.wire import INT64_MAX, Int64, Stop, TinkerPath
from app.sampling.openai import Route
from app.sampling.params import check_sampling_ranges, prompt_vision

router = APIRouter(prefix="/v1")


Count = Annotated[int, Field(ge=1, le=INT64_MAX)]  # then checked against the limits (_check_limits)
TopK = Annotated[int, Field(ge=0, le=INT64_MAX)]
# what the sampler checks at every token: bounded like asample's stop (limits.max_stop_*, limits.max_logit_bias_*)
Words = Annotated[list[str], Limit("max_stop_sequences", "items"), Limit("max_stop_chars", "total_chars")]
TokenIds = Annotated[list[Int64], Limit("max_stop_sequences", "items")]
TokenBias = Annotated[dict[Annotated[str, Field(max_length=20)], float], Limit("max_logit_bias_entries", "items")]
AllowedIds = Annotated[list[Int64], Limit("max_logit_bias_entries", "items")]
# a JSON schema, regex, grammar or choice list the sampler compiles before the first token
Structured = Annotated[str | list[str] | dict[str, Any], Limit("max_structured_output_bytes", "json_bytes")]


class _Request(BaseModel):
    """The fields the ingress checks; every other field goes to vLLM as sent (vLLM validates the whole body). Those
    vLLM applies at every token or compiles first (stops, banned words, biases, structured outputs) are bounded here."""

    model_config = ConfigDict(extra="allow")

    model: TinkerPath  # a base model name or a tinker:// checkpoint path
    n: Count = 1
    max_tokens: Count | None = None
    stream: bool = False
    temperature: float | None = None  # checked with asample's ranges (app.sampling.params)
    top_k: Int64 | None = None
    top_p: float | None = None
    stop: Stop | None = None
    stop_token_ids: TokenIds | None = None
    bad_words: Words | None = None
    logit_bias: TokenBias | None = None
    allowed_token_ids: AllowedIds | None = None
    response_format: Structured | None = None
    structured_outputs: Structured | None = None
    guided_json: Structured | None = None
    guided_regex: Structured | None = None
    guided_grammar: Structured | None = None
    guided_choice: Structured | None = None


class CompletionRequest(_Request):
    # the body is capped by limits.max_sample_request_bytes; prompts x n by limits.max_num_samples (_check_limits)
    # and each prompt's tokens by the model's context (vLLM)
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: TopK | None = None


class ChatRequest(_Request):
    messages: list[dict[str, Any]]  # capped by limits.max_sample_request_bytes; its tokens by the context (vLLM)
    max_completion_tokens: Count | None = None
    top_logprobs: TopK | None = None


async def _model(services: Services, model: str, user: str) -> tuple[str, str | None]:
    """(base model, adapter location or None) of a base model name or a readable tinker:// checkpoint path."""
    served = sorted(services.model_limits)
    if model.startswith("tinker://"):
        base_model, location = await adapter_of(services, model, user, field="model")
        if base_model not in served:
            raise UserError(f"model {model!r} was trained on {base_model!r}, no longer served here", field="model")
        return base_model, location
    if model not in served:
        raise NotFound(
            f"model {model!r} is not served here: name a base model ({served}) or a tinker:// sampler checkpoint path",
            field="model",
        )
    return model, None


def _check_limits(
    services: Services, user: str, base_model: str, body: _Request, token_field: str, logprobs_field: str
) -> int:
    """Check the images, the sampling ranges, the sequences (prompts x n), the token budget and logprobs against the
    limits, and charge the prompt's tokens with the budget's to the user's token rate; the budget. A request for more
    tokens than a whole minute's rate is refused outright."""
    limits, quotas = services.config.limits, services.config.quotas
    check_sampling_ranges(
        limits,
        services.model_limits[base_model],
        1.0 if body.temperature is None else body.temperature,
        -1 if body.top_k in (None, 0) else body.top_k,  # vLLM reads 0 as off too
        1.0 if body.top_p is None else body.top_p,
    )
    prompts = len(body.prompt) if isinstance(body, CompletionRequest) and _is_batch(body.prompt) else 1
    if prompts * body.n > limits.max_num_samples:
        raise LimitExceeded(
            f"{prompts} prompts x n={body.n} exceed limits.max_num_samples={limits.max_num_samples} sequences",
            field="n",
        )
    max_tokens = getattr(body, token_field) or limits.default_sample_tokens
    if max_tokens > limits.max_sample_tokens:
        raise LimitExceeded(
            f"{token_field}={max_tokens} exceeds limits.max_sample_tokens={limits.max_sample_tokens}", field=token_field
        )
    logprobs = getattr(body, logprobs_field)
    if logprobs is not None and logprobs > limits.max_topk_logprobs:
        raise LimitExceeded(
            f"{logprobs_field}={logprobs} exceeds limits.max_topk_logprobs={limits.max_topk_logprobs}",
            field=logprobs_field,
        )
    prompt_tokens = _prompt_tokens(body, services, base_model)
    tokens = prompt_tokens + prompts * body.n * max_tokens
    per_minute = quotas.for_user(user).sample_tokens_per_minute_per_user
    if tokens > per_minute:  # the token bucket would let it through when full
        raise LimitExceeded(
            f"{prompt_tokens} prompt tokens + {prompts} prompts x n={body.n} x {token_field}={max_tokens} = {tokens} "
            f"tokens exceed quotas.sample_tokens_per_minute_per_user={per_minute}",
            field=token_field,
        )
    check_sample_tokens(services, user, tokens)
    return max_tokens


def _is_batch(prompt: object) -> bool:
    return isinstance(prompt, list) and bool(prompt) and not isinstance(prompt[0], int)


def _prompt_tokens(body: _Request, services: Services, base_model: str) -> int:
    """The prompt tokens the sampler prefills, as charged to the user's token rate: token ids as sent; text (the
    ingress holds no tokenizer) at one token per UTF-8 byte, which no tokenizer's count exceeds; images (checked
    here: app.api.openai_images) at their vision tokens."""
    if isinstance(body, CompletionRequest):
        return _size(body.prompt)
    messages = cast(ChatRequest, body).messages
    vision = prompt_vision(services.config.limits, services.model_limits[base_model])
    images = check_images(messages, base_model, vision)
    return _size(messages) - sum(_size(part) for _, part in image_parts(messages)) + images


def _size(prompt: object) -> int:
    """Token ids, and UTF-8 bytes of text, in a prompt or a list of them, or in chat messages' JSON."""
    size, stack = 0, [prompt]
    while stack:  # no recursion: nesting is the client's to choose
        value = stack.pop()
        if isinstance(value, str):
            size += len(value.encode())
        elif isinstance(value, dict | list):
            stack.extend(value.values() if isinstance(value, dict) else value)
        else:
            size += 1
    return size


async def _forward(services: Services, user: str, route: Route, body: _Request, token_field: str) -> Any:
    base_model, adapter_location = await _model(services, body.model, user)
    logprobs_field = "logprobs" if route == "completions" else "top_logprobs"
    max_tokens = _check_limits(services, user, base_model, body, token_field, logprobs_field)
    admit_sample(services, user, base_model)
    payload = {**body.model_dump(exclude_unset=True), token_field: max_tokens}
    stream = services.samplers.openai(base_model, adapter_location, route, payload, user)
    first = await anext(stream)
    if isinstance(first, tuple):
        await stream.aclose()
        status, answer = first
        if status >= 400:
            raise Relayed(status, answer)
        return answer
    return StreamingResponse(_chain(first, stream), media_type="text/event-stream")


async def _chain(first: str, rest: AsyncGenerator[Any, None]) -> AsyncIterator[str]:
    try:
        yield first
        async for line in rest:
            yield line
    finally:  # the client may have gone: the sampler stops too
        await rest.aclose()


@router.get("/models")
async def list_models(services: ServicesDep, _: UserDep) -> dict:
    return {"object": "list", "data": await services.samplers.openai_models()}


@router.post("/completions")
async def completions(body: CompletionRequest, services: ServicesDep, user: UserDep) -> Any:
    return await _forward(services, user, "completions", body, "max_tokens")


@router.post("/chat/completions")
async def chat_completions(body: ChatRequest, services: ServicesDep, user: UserDep) -> Any:
    token_field = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    return await _forward(services, user, "chat", body, token_field)
