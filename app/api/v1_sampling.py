"""What the /v1/ sampling routes (OpenAI's and Anthropic's) share: the model a request names, the limits and token
rate its budget is checked against, and its relay to the base model's Sampler (vLLM's serving layers), whose JSON
answer or SSE stream is passed on as it is."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from fastapi.responses import StreamingResponse

from app.api.deps import Services
from app.api.quotas import admit_sample, check_sample_tokens
from app.api.sampling import adapter_of
from app.errors import LimitExceeded, NotFound, Relayed, UserError
from app.sampling.openai import Route
from app.sampling.params import check_sampling_ranges


async def served_model(services: Services, model: str, user: str) -> tuple[str, str | None]:
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


def check_budget(
    services: Services,
    user: str,
    base_model: str,
    sampling: tuple[float | None, int | None, float | None],
    token_field: str,
    requested: int | None,
    sequences: int,
    prompt_tokens: int,
) -> int:
    """Check the sampling ranges (`sampling`: temperature, top_k, top_p as sent) and the token budget (`requested`
    in `token_field`, else limits.default_sample_tokens) against the limits, and charge the prompt's tokens with
    every sequence's budget to the user's token rate; the budget. More tokens than a whole minute's rate is refused
    outright."""
    limits = services.config.limits
    temperature, top_k, top_p = sampling
    check_sampling_ranges(
        limits,
        services.model_limits[base_model],
        1.0 if temperature is None else temperature,
        -1 if top_k in (None, 0) else top_k,  # vLLM reads 0 as off too
        1.0 if top_p is None else top_p,
    )
    max_tokens = requested or limits.default_sample_tokens
    if max_tokens > limits.max_sample_tokens:
        raise LimitExceeded(
            f"{token_field}={max_tokens} exceeds limits.max_sample_tokens={limits.max_sample_tokens}", field=token_field
        )
    tokens = prompt_tokens + sequences * max_tokens
    per_minute = services.config.quotas.for_user(user).sample_tokens_per_minute_per_user
    if tokens > per_minute:  # the token bucket would let it through when full
        raise LimitExceeded(
            f"{prompt_tokens} prompt tokens + {sequences} sequences x {token_field}={max_tokens} = {tokens} "
            f"tokens exceed quotas.sample_tokens_per_minute_per_user={per_minute}",
            field=token_field,
        )
    check_sample_tokens(services, user, tokens)
    return max_tokens


def text_size(value: object) -> int:
    """Token ids, and UTF-8 bytes of text, in a prompt, a list of them, or messages' JSON: the prompt tokens charged
    to the token rate (the ingress holds no tokenizer; no tokenizer's count of a text exceeds its bytes)."""
    size, stack = 0, [value]
    while stack:  # no recursion: nesting is the client's to choose
        item = stack.pop()
        if isinstance(item, str):
            size += len(item.encode())
        elif isinstance(item, dict | list):
            stack.extend(item.values() if isinstance(item, dict) else item)
        else:
            size += 1
    return size


async def relay(
    services: Services, user: str, base_model: str, adapter_location: str | None, route: Route, payload: dict[str, Any]
) -> Any:
    """Admit `payload` to `base_model`'s pending samples and send it to its Sampler: the JSON answer, a
    StreamingResponse of its SSE lines, or the Sampler's error answer raised as Relayed."""
    admit_sample(services, user, base_model)
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
