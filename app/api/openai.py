"""OpenAI-compatible routes: /v1/models, /v1/completions and /v1/chat/completions on a base model or a tinker://
checkpoint the caller may read. The ingress checks the model and the limits; the base model's Sampler answers
through vLLM's own OpenAI serving layer (app.sampling.openai), whose JSON or SSE stream is passed on as it is
(app.api.v1_sampling)."""

from __future__ import annotations

from typing import Annotated, Any, cast

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from app.api.deps import Services, ServicesDep, UserDep
from app.api.openai_images import check_images, image_parts
from app.api.v1_sampling import check_budget, relay, served_model, text_size
from app.errors import LimitExceeded
from app.protocol.field_limits import Limit
from app.protocol.wire import INT64_MAX, Int64, Stop, TinkerPath
from app.sampling.openai import Route
from app.sampling.params import prompt_vision

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


def _check_limits(
    services: Services, user: str, base_model: str, body: _Request, token_field: str, logprobs_field: str
) -> int:
    """Check the images, the sequences (prompts x n) and logprobs against the limits, then the sampling ranges and
    the token budget (app.api.v1_sampling.check_budget); the budget."""
    limits = services.config.limits
    prompts = len(body.prompt) if isinstance(body, CompletionRequest) and _is_batch(body.prompt) else 1
    if prompts * body.n > limits.max_num_samples:
        raise LimitExceeded(
            f"{prompts} prompts x n={body.n} exceed limits.max_num_samples={limits.max_num_samples} sequences",
            field="n",
        )
    logprobs = getattr(body, logprobs_field)
    if logprobs is not None and logprobs > limits.max_topk_logprobs:
        raise LimitExceeded(
            f"{logprobs_field}={logprobs} exceeds limits.max_topk_logprobs={limits.max_topk_logprobs}",
            field=logprobs_field,
        )
    sampling = (body.temperature, body.top_k, body.top_p)
    requested = getattr(body, token_field)
    prompt_tokens = _prompt_tokens(body, services, base_model)
    return check_budget(services, user, base_model, sampling, token_field, requested, prompts * body.n, prompt_tokens)


def _is_batch(prompt: object) -> bool:
    return isinstance(prompt, list) and bool(prompt) and not isinstance(prompt[0], int)


def _prompt_tokens(body: _Request, services: Services, base_model: str) -> int:
    """The prompt tokens the sampler prefills, as charged to the user's token rate: app.api.v1_sampling.text_size,
    with images (checked here: app.api.openai_images) at their vision tokens."""
    if isinstance(body, CompletionRequest):
        return text_size(body.prompt)
    messages = cast(ChatRequest, body).messages
    vision = prompt_vision(services.config.limits, services.model_limits[base_model])
    images = check_images(messages, base_model, vision)
    return text_size(messages) - sum(text_size(part) for _, part in image_parts(messages)) + images


async def _forward(services: Services, user: str, route: Route, body: _Request, token_field: str) -> Any:
    base_model, adapter_location = await served_model(services, body.model, user)
    logprobs_field = "logprobs" if route == "completions" else "top_logprobs"
    max_tokens = _check_limits(services, user, base_model, body, token_field, logprobs_field)
    payload = {**body.model_dump(exclude_unset=True), token_field: max_tokens}
    return await relay(services, user, base_model, adapter_location, route, payload)


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
