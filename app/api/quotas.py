"""Per-user quotas and per-key rates (quotas.*_per_user, each user's own in quotas.users;
quotas.requests_per_minute_per_key). Sizes (live models,
checkpoint bytes) answer a user error naming the limit; rates and queues (pending training operations, sampled
tokens a minute, requests a minute, pending samples) answer 429 with Retry-After, which the SDK waits out and
retries. Nothing already accepted is dropped: a refusal comes before a request's future exists."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

from app.api.deps import Admitting, Services
from app.config import QuotasConfig
from app.errors import LimitExceeded, Overloaded


def _retry_after(seconds: float) -> int:
    return max(1, math.ceil(seconds))


def check_request_rate(services: Services, key_id: int) -> None:
    per_minute = services.config.quotas.requests_per_minute_per_key
    wait = services.request_rate.take(str(key_id), 1)
    if wait:
        raise Overloaded(
            f"this API key sent more than quotas.requests_per_minute_per_key={per_minute}; retry in {wait:.1f} s",
            retry_after_s=_retry_after(wait),
        )


def check_sample_tokens(services: Services, user: str, tokens: int) -> None:
    """Charge `tokens` (the prompt's, prefilled once, plus every sequence's max_tokens) to `user`'s sampling rate."""
    per_minute = services.config.quotas.for_user(user).sample_tokens_per_minute_per_user
    wait = services.sample_rate.take(user, tokens, per_minute=per_minute)
    if wait:
        raise Overloaded(
            f"this sample asks for {tokens} tokens (prompt + num_samples x max_tokens) beyond your "
            f"quotas.sample_tokens_per_minute_per_user={per_minute}; retry in {wait:.1f} s",
            retry_after_s=_retry_after(wait),
            details={"queue_state": "paused_rate_limit"},
        )


def sample_share(quotas: QuotasConfig) -> int:
    """A user's fair share of a base model's pending samples: quotas.max_pending_samples_per_user (theirs, given
    `quotas.for_user`), by default a quarter of quotas.max_pending_samples."""
    share = quotas.max_pending_samples_per_user
    return share if share is not None else max(1, quotas.max_pending_samples // 4)


def admit_sample(services: Services, user: str, base_model: str) -> None:
    """Hold one of `base_model`'s pending-sample slots for `user` (the caller sends the sample or releases it);
    429 when the pool is full, or when `user` is past their fair share and the rest is the others'."""
    quotas = services.config.quotas
    limit, share = quotas.max_pending_samples, sample_share(quotas.for_user(user))
    if services.samplers.admit(base_model, user, limit, share):
        return
    held = services.samplers.held(base_model, user)
    reason = (
        f"you hold {held} of them, past your share (quotas.max_pending_samples_per_user={share}), and the rest is "
        "kept for other users"
        if held >= share
        else f"all {limit} are queued (quotas.max_pending_samples)"
    )
    raise Overloaded(
        f"no room for another sample of {base_model}: {reason}; retry shortly",
        retry_after_s=1,
        details={"queue_state": "paused_capacity"},
    )


@asynccontextmanager
async def pending_admission(
    services: Services, user: str, model_id: str, seq_id: int, nbytes: int = 0
) -> AsyncIterator[None]:
    """check_pending_requests, holding the user's turn until the block ends (the operation's future and journal row
    written, so the database counts it): a burst of concurrent requests is admitted one at a time."""
    admitting = services.admitting.setdefault(user, Admitting())
    admitting.present += 1
    try:
        async with admitting.lock:
            await check_pending_requests(services, user, model_id, seq_id, nbytes)
            yield
    finally:
        admitting.present -= 1
        if not admitting.present:
            services.admitting.pop(user, None)


async def check_pending_requests(services: Services, user: str, model_id: str, seq_id: int, nbytes: int = 0) -> None:
    """Room for one more of `user`'s training operations, holding `nbytes` (a forward_backward's batch) until it runs.
    Past the limits, only the seq_id the model's pending operations wait for is admitted (the SDK sends a
    forward_backward's first chunk after the others): refusing it would stall them. Any other seq_id, also one
    before every pending one (a count down from a far seq_id), is refused."""
    quotas = services.config.quotas.for_user(user)
    if nbytes > quotas.max_pending_bytes_per_user:
        raise LimitExceeded(
            f"this request's batch holds {nbytes} bytes, more than quotas.max_pending_bytes_per_user="
            f"{quotas.max_pending_bytes_per_user}: send fewer datums per request",
            field="data",
        )
    count, held = await services.quotas.pending(user)
    full = count >= quotas.max_pending_requests_per_user
    if full or held + nbytes > quotas.max_pending_bytes_per_user:
        if seq_id == await services.quotas.awaited_seq(model_id):
            return
        limit = (
            f"{quotas.max_pending_requests_per_user} training operations pending (quotas.max_pending_requests_per_user)"
            if full
            else f"{held} bytes of training data pending (quotas.max_pending_bytes_per_user="
            f"{quotas.max_pending_bytes_per_user})"
        )
        raise Overloaded(
            f"you have {limit}; retry when some finish",
            retry_after_s=2,
            details={"queue_state": "paused_rate_limit"},
        )


async def check_live_models(services: Services, user: str, model_id: str) -> None:
    limit = services.config.quotas.for_user(user).max_live_models_per_user
    if await services.quotas.live_models(user, besides=model_id) >= limit:
        raise LimitExceeded(
            f"you have {limit} live models (quotas.max_live_models_per_user): unload one (unload_model, or close "
            "its ServiceClient) first",
            field="model_seq_id",
        )


async def check_checkpoint_bytes(services: Services, user: str, field: str = "path") -> None:
    limit = services.config.quotas.for_user(user).max_checkpoint_bytes_per_user
    used = await services.quotas.checkpoint_bytes(user)
    if used >= limit:
        raise LimitExceeded(
            f"your live checkpoints hold {used} bytes, quotas.max_checkpoint_bytes_per_user={limit}: delete some "
            "(RestClient.delete_checkpoint) or let them expire first",
            field=field,
        )


@contextmanager
def long_poll_slot(services: Services, user: str) -> Iterator[None]:
    """Hold one of `user`'s long-poll slots on this replica while a retrieve_future(s) waits; 429 when none is
    free (the SDK backs off and polls again)."""
    limit, held = services.config.quotas.for_user(user).max_long_polls_per_user, services.long_polls
    if held.get(user, 0) >= limit:
        raise Overloaded(
            f"you have {limit} retrieve_future calls waiting at once (quotas.max_long_polls_per_user); retry when "
            "some answer",
            retry_after_s=1,
        )
    held[user] = held.get(user, 0) + 1
    try:
        yield
    finally:
        held[user] -= 1
        if not held[user]:
            del held[user]
