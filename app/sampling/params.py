"""An asample request checked against the limits and the model, as engine-neutral sampling arguments.

Every failure is a user error naming the request field, raised before anything is queued.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import cast

from app.config import LimitsConfig
from app.errors import LimitExceeded, UserError, require
from app.images.assets import NO_ASSETS, ImageAssets
from app.images.checks import ImageBudget, ImageLimits, text_only
from app.protocol.chunks import IMAGE_KINDS, IMAGE_POINTER, TEXT
from app.protocol.wire import SampleRequest
from app.training_data.validation import ModelLimits

_SEED_RANGE = 2**63  # the SDK allows any 64-bit seed; engines take a non-negative one


@dataclass(frozen=True)
class SampleImage:
    """An image in a prompt: its encoded bytes, which stand for prompt[start : start + length] (image-pad tokens)."""

    start: int
    length: int
    data: bytes


@dataclass(frozen=True)
class SampleArgs:
    prompt: tuple[int, ...]  # an image's positions hold its image-pad tokens
    num_samples: int
    max_tokens: int
    temperature: float
    top_k: int  # -1: off
    top_p: float
    seed: int | None
    stop_strings: tuple[str, ...]
    stop_token_ids: tuple[int, ...]
    ignore_eos: bool  # `stop: []` disables every stop, EOS included
    prompt_logprobs: bool
    topk_prompt_logprobs: int
    topk_sample_logprobs: int
    prompt_logprobs_last_n: int | None
    usage_session: str | None = None  # not the engine's: the session its tokens are counted for (app.db.usage)
    record_for_session: str | None = None  # not the engine's: the Sampler keeps a stability record of each
    # sampled sequence for this session (record_stability_info)
    images: tuple[SampleImage, ...] = ()  # in prompt order

    @property
    def wants_prompt_logprobs(self) -> bool:
        return self.prompt_logprobs or self.topk_prompt_logprobs > 0


@dataclass(frozen=True)
class PromptVision:
    """How a vision-language base takes a prompt's images: each checked by `budget` (bounds, header, token count)
    and standing for that many `image_token_id` tokens; a pointer chunk's image read from `assets`."""

    budget: ImageBudget
    image_token_id: int
    max_images: int  # limits.max_images_per_prompt
    assets: ImageAssets = NO_ASSETS

    def check_count(self, images: int, field: str) -> None:
        """Refuse more than limits.max_images_per_prompt images (counted before any is read)."""
        if images > self.max_images:
            raise LimitExceeded(
                f"{field} holds {images} images, over limits.max_images_per_prompt={self.max_images}", field=field
            )


def prompt_vision(limits: LimitsConfig, model: ModelLimits, assets: ImageAssets = NO_ASSETS) -> PromptVision | None:
    """How `model` takes a prompt's images (pointed ones read from `assets`); None on a text-only base."""
    spec = model.vision_spec
    if spec is None or model.image_token_id is None:
        return None
    budget = ImageBudget(spec, ImageLimits.of(limits))
    return PromptVision(budget, model.image_token_id, limits.max_images_per_prompt, assets)


def holds_images(prompt: dict) -> bool:
    """Whether a ModelInput JSON holds image chunks (its check then decodes base64 and reads headers and files:
    callers run it off the event loop)."""
    chunks = prompt.get("chunks")
    return isinstance(chunks, list) and any(_is_image(c) for c in chunks)


def _is_image(chunk: object) -> bool:
    return isinstance(chunk, dict) and chunk.get("type") in IMAGE_KINDS


def prompt_tokens(
    prompt: dict, context: int, vision: PromptVision | None = None
) -> tuple[tuple[int, ...], tuple[SampleImage, ...]]:
    """The tokens of a ModelInput JSON, each image chunk as its image-pad tokens, and its images (on a
    vision-language base: `vision`; a text-only base takes text chunks only). Chunks and tokens are counted against
    the model's `context` length, and each image against the bounds from its header, before anything is decoded."""
    chunks = prompt.get("chunks", [])
    require(
        isinstance(chunks, list) and len(chunks) > 0, "prompt.chunks must be a non-empty list", field="prompt.chunks"
    )
    if len(chunks) >= context:  # a chunk that fits holds a token
        raise LimitExceeded(
            f"prompt.chunks has {len(chunks)} chunks; the model's context length is {context}", field="prompt.chunks"
        )
    if vision is not None:
        vision.check_count(sum(map(_is_image, chunks)), "prompt.chunks")
    tokens: list[int] = []
    images: list[SampleImage] = []
    for i, chunk in enumerate(chunks):
        kind = chunk.get("type", "encoded_text") if isinstance(chunk, dict) else None
        field = f"prompt.chunks[{i}]"
        if kind in IMAGE_KINDS and vision is not None:
            image = _image(cast(dict, chunk), field, len(tokens), vision)
            images.append(image)
            ids: list = [vision.image_token_id] * image.length
        elif kind != TEXT:
            raise text_only(field, kind)
        else:
            ids = chunk.get("tokens")
            require(isinstance(ids, list), f"{field}.tokens must be a list of integers", field=f"{field}.tokens")
            require(
                vision is None or vision.image_token_id not in ids,
                f"{field}.tokens holds the image-pad token {vision and vision.image_token_id}: send images as image "
                "chunks",
                field=f"{field}.tokens",
            )
        if (total := len(tokens) + len(ids)) >= context:
            raise LimitExceeded(
                f"the prompt has {total} tokens; the model's context length is {context}, which must leave room for "
                "one new token",
                field="prompt",
            )
        require(
            all(isinstance(t, int) and not isinstance(t, bool) for t in ids),
            f"{field}.tokens must be a list of integers",
            field=f"{field}.tokens",
        )
        tokens.extend(ids)
    require(bool(tokens), "prompt has no tokens", field="prompt")
    return tuple(tokens), tuple(images)


def image_bytes(encoded: str, field: str, max_bytes: int) -> bytes:
    """The bytes of a base64 image at `field`, its length checked against limits.max_image_bytes before decoding."""
    if len(encoded) > 4 * (max_bytes // 3 + 1):  # base64 holds 3 bytes in 4 characters
        raise LimitExceeded(f"{field} holds over {max_bytes} bytes (limits.max_image_bytes)", field=field)
    try:
        return base64.b64decode(encoded, validate=True)
    except binascii.Error as exc:
        raise UserError(f"{field} is not valid base64: {exc}", field=field) from exc


def _image(chunk: dict, field: str, start: int, vision: PromptVision) -> SampleImage:
    """An image chunk's bytes, checked from their header: its base64 text is measured against
    limits.max_image_bytes before it is decoded; a pointer chunk's file is located and read (app.images.assets)."""
    expected, fmt = chunk.get("expected_tokens"), str(chunk.get("format"))
    require(
        expected is None or (isinstance(expected, int) and not isinstance(expected, bool)),
        f"{field}.expected_tokens must be an integer",
        field=f"{field}.expected_tokens",
    )
    if chunk.get("type") == IMAGE_POINTER:
        location = chunk.get("location")
        require(isinstance(location, str), f"{field}.location must be a string", field=f"{field}.location")
        data = vision.assets.read(field, vision.assets.locate(field, cast(str, location)), fmt)
    else:
        encoded = chunk.get("data")
        require(isinstance(encoded, str), f"{field}.data must be the image's bytes in base64", field=f"{field}.data")
        data = image_bytes(cast(str, encoded), f"{field}.data", vision.budget.limits.max_image_bytes)
    _, length = vision.budget.check(0, field, data, fmt, expected)
    return SampleImage(start=start, length=length, data=data)


def _stops(stop: str | list | None, vocab_size: int) -> tuple[tuple[str, ...], tuple[int, ...], bool]:
    """(stop strings, stop token ids, ignore_eos) from `sampling_params.stop`."""
    if stop is None:
        return (), (), False
    if isinstance(stop, str):
        return (stop,), (), False
    if not stop:
        return (), (), True
    if all(isinstance(s, str) for s in stop):
        require(all(stop), "sampling_params.stop strings must be non-empty", field="sampling_params.stop")
        return tuple(stop), (), False
    if all(isinstance(t, int) and not isinstance(t, bool) for t in stop):
        bad = [t for t in stop if not 0 <= t < vocab_size]
        require(
            not bad,
            f"sampling_params.stop token ids {bad} are outside the vocabulary [0, {vocab_size})",
            field="sampling_params.stop",
        )
        return (), tuple(stop), False
    raise UserError(
        "sampling_params.stop must be a string, a list of strings or a list of token ids", field="sampling_params.stop"
    )


def check_sampling_ranges(
    limits: LimitsConfig, model: ModelLimits, temperature: float, top_k: int, top_p: float, prefix: str = ""
) -> None:
    """Refuse a temperature outside [0, limits.max_sample_temperature], a top_k other than -1 (off) or in [1, the
    vocabulary], a top_p outside (0, 1] (non-finite values included), naming `prefix` + the field."""
    high = limits.max_sample_temperature
    require(
        0 <= temperature <= high,
        f"{prefix}temperature {temperature} must be in [0, limits.max_sample_temperature={high:g}]",
        field=f"{prefix}temperature",
    )
    require(
        top_k == -1 or 1 <= top_k <= model.vocab_size,
        f"{prefix}top_k {top_k} must be -1 (off) or in [1, {model.vocab_size}]",
        field=f"{prefix}top_k",
    )
    require(0 < top_p <= 1, f"{prefix}top_p {top_p} must be in (0, 1]", field=f"{prefix}top_p")


def sample_args(
    req: SampleRequest, limits: LimitsConfig, model: ModelLimits, assets: ImageAssets = NO_ASSETS
) -> SampleArgs:
    """Validate an asample request; returns what the sampler needs. Blocking when its prompt `holds_images` (their
    base64 decoded, pointed files read from `assets`)."""
    tokens, images = prompt_tokens(req.prompt, model.max_context_length, prompt_vision(limits, model, assets))
    bad = [t for t in tokens if not 0 <= t < model.vocab_size]
    require(not bad, f"prompt token ids {bad[:5]} are outside the vocabulary [0, {model.vocab_size})", field="prompt")
    if not 1 <= req.num_samples <= limits.max_num_samples:
        raise LimitExceeded(
            f"num_samples {req.num_samples} must be in [1, limits.max_num_samples={limits.max_num_samples}]",
            field="num_samples",
        )
    p = req.sampling_params
    max_tokens = limits.default_sample_tokens if p.max_tokens is None else p.max_tokens
    if not 1 <= max_tokens <= limits.max_sample_tokens:
        raise LimitExceeded(
            f"sampling_params.max_tokens {max_tokens} must be in [1, limits.max_sample_tokens="
            f"{limits.max_sample_tokens}]",
            field="sampling_params.max_tokens",
        )
    if len(tokens) + max_tokens > model.max_context_length:
        raise LimitExceeded(
            f"prompt ({len(tokens)} tokens) + sampling_params.max_tokens ({max_tokens}) exceeds the "
            f"model's context length {model.max_context_length}",
            field="sampling_params.max_tokens",
        )
    check_sampling_ranges(limits, model, p.temperature, p.top_k, p.top_p, prefix="sampling_params.")
    for name in ("topk_prompt_logprobs", "topk_sample_logprobs"):
        k = getattr(req, name)
        if not 0 <= k <= limits.max_topk_logprobs:
            raise LimitExceeded(
                f"{name} {k} must be in [0, limits.max_topk_logprobs={limits.max_topk_logprobs}]", field=name
            )
    require(
        req.prompt_alt_tokens_k == 0,
        "prompt_alt_tokens_k is not supported by this server; send 0",
        field="prompt_alt_tokens_k",
    )
    require(
        req.target_prompt_logprobs is None,
        "target_prompt_logprobs is not supported by this server",
        field="target_prompt_logprobs",
    )
    last_n = req.prompt_logprobs_last_n
    if last_n is not None:
        require(
            req.prompt_logprobs, "prompt_logprobs_last_n needs prompt_logprobs=true", field="prompt_logprobs_last_n"
        )
        require(last_n >= 0, f"prompt_logprobs_last_n {last_n} must be >= 0", field="prompt_logprobs_last_n")
    stop_strings, stop_ids, ignore_eos = _stops(p.stop, model.vocab_size)
    return SampleArgs(
        prompt=tokens,
        num_samples=req.num_samples,
        max_tokens=max_tokens,
        temperature=p.temperature,
        top_k=p.top_k,
        top_p=p.top_p,
        seed=None if p.seed is None else p.seed % _SEED_RANGE,
        stop_strings=stop_strings,
        stop_token_ids=stop_ids,
        ignore_eos=ignore_eos,
        prompt_logprobs=req.prompt_logprobs,
        topk_prompt_logprobs=req.topk_prompt_logprobs,
        topk_sample_logprobs=req.topk_sample_logprobs,
        prompt_logprobs_last_n=last_n,
        images=images,
    )
