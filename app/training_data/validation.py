"""Checks of a decoded forward/forward_backward request against the loss, the model and the limits.

Each failure is a UserError (or LimitExceeded) naming the offending field, raised before any work is queued.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from app.config import LimitsConfig
from app.errors import LimitExceeded, UserError
from app.images.checks import ImageBudget, ImageLimits, text_only
from app.images.tokens import VisionSpec
from app.training_data.batch import ForwardBackwardInput, PackedBatch
from app.training_data.custom_losses import CustomLossProgram
from app.training_data.losses import LossSpec, get_loss, loss_for_role, resolve_config


@dataclass(frozen=True)
class ValidLoss:
    name: str  # the loss to run (a critic's `ppo` becomes `ppo_critic`)
    config: dict[str, float]  # loss_fn_config with defaults filled in


@dataclass(frozen=True)
class ModelLimits:
    vocab_size: int
    max_context_length: int
    arch: str = "qwen2"  # the base's model family (app.models.families), what get_info reports
    tokenizer_id: str = ""  # what get_info reports: the served name of a local base, the Hub id of another
    vision: dict[str, int] | None = None  # a vision-language base's VisionSpec fields; None: text-only
    image_token_id: int | None = None  # a vision-language base's image-pad token (a prompt's image stands as them)

    @property
    def vision_spec(self) -> VisionSpec | None:
        return None if self.vision is None else VisionSpec(**self.vision)


def validate_forward_backward(
    inp: ForwardBackwardInput,
    limits: LimitsConfig,
    model: ModelLimits,
    role: str = "policy",
    custom: CustomLossProgram | None = None,
) -> ValidLoss:
    """Validate the request for a model of `role`; returns the loss to run and its full config. A custom loss
    (`custom`: the stored loss that loss_fn_config.loss_id names) is checked against its declared inputs."""
    loss_fn = loss_for_role(inp.loss_fn, role)
    spec = get_loss(loss_fn)
    config = resolve_config(loss_fn, inp.loss_fn_config) if custom is None else {}
    batch = inp.batch
    if batch.num_datums > limits.max_datums_per_request:
        raise LimitExceeded(
            f"{batch.num_datums} datums exceed limits.max_datums_per_request={limits.max_datums_per_request}",
            field="data",
        )
    max_tokens = min(limits.max_tokens_per_datum or model.max_context_length, model.max_context_length)
    too_long = np.flatnonzero(batch.lengths > max_tokens)
    if too_long.size:
        i = int(too_long[0])
        raise LimitExceeded(
            f"data[{i}].model_input has {int(batch.lengths[i])} tokens; the limit is {max_tokens}",
            field=f"data[{i}].model_input",
        )
    empty = np.flatnonzero(batch.lengths == 0)
    if empty.size:
        raise UserError(f"data[{int(empty[0])}].model_input is empty", field=f"data[{int(empty[0])}].model_input")
    if custom is None:
        _check_input_names(inp, loss_fn, spec)
    else:
        _check_custom_inputs(batch, custom)
    targets = batch.loss_inputs.get("target_tokens")
    if targets is not None and targets.ndim == 2 and not spec.allows_2d_targets:
        raise UserError(f"loss_fn {loss_fn!r} takes 1-D target_tokens", field="loss_fn_inputs.target_tokens")
    per_token = targets.shape[1:] if targets is not None else ()
    for name, arr in batch.loss_inputs.items():
        if custom is None and name != "target_tokens" and arr.shape[1:] != per_token:
            raise UserError(
                f"loss_fn_inputs.{name} has shape {arr.shape[1:]} per token; expected {per_token}",
                field=f"loss_fn_inputs.{name}",
            )
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            raise UserError(f"loss_fn_inputs.{name} holds NaN or infinite values", field=f"loss_fn_inputs.{name}")
    _check_images(batch, limits, model)
    _check_vocab(batch, model.vocab_size)
    return ValidLoss(loss_fn, config)


def _check_images(batch: PackedBatch, limits: LimitsConfig, model: ModelLimits) -> None:
    """Each image chunk against the base's processor and the image limits, from its header (nothing is decoded)."""
    if not batch.images:
        return
    spec = model.vision_spec
    if spec is None:
        raise text_only(batch.images[0].field, "image")
    budget = ImageBudget(spec, ImageLimits.of(limits))
    for image in batch.images:
        budget.check(image.datum, image.field, image.data, image.format, image.tokens)


def _check_input_names(inp: ForwardBackwardInput, loss_fn: str, spec: LossSpec) -> None:
    """Every required input present (a critic's forward may send none), nothing the loss would ignore."""
    present = set(inp.batch.loss_inputs)
    prediction_only = inp.forward_only and not spec.forward_needs_inputs and not present & spec.required_inputs
    missing = sorted(spec.required_inputs - present)
    if missing and not prediction_only:
        raise UserError(f"loss_fn {loss_fn!r} needs loss_fn_inputs {missing}", field=f"loss_fn_inputs.{missing[0]}")
    unused = sorted(present - spec.required_inputs - spec.optional_inputs)
    if unused:
        raise UserError(f"loss_fn_inputs {unused} are not used by {loss_fn!r}", field=f"loss_fn_inputs.{unused[0]}")


def _check_custom_inputs(batch: PackedBatch, custom: CustomLossProgram) -> None:
    """Each input the loss reads is present at its declared rank; logprobs has target_tokens' rank. Inputs the
    loss does not read are ignored (the SDK sends a datum's loss_fn_inputs unchanged)."""
    for i, (name, rank) in enumerate(custom.inputs):
        key = "target_tokens" if i == 0 else name
        arr = batch.loss_inputs.get(key)
        if arr is None:
            raise UserError(f"custom loss {custom.name!r} reads loss_fn_inputs[{key!r}]", field=f"loss_fn_inputs.{key}")
        if arr.ndim != rank:
            raise UserError(
                f"loss_fn_inputs.{key} has rank {arr.ndim} per datum; custom loss {custom.name!r} declared "
                f"{name} with rank {rank}",
                field=f"loss_fn_inputs.{key}",
            )


def _check_vocab(batch: PackedBatch, vocab_size: int) -> None:
    tokens = batch.tokens
    if batch.images:  # an image's placeholders are no token ids
        tokens = tokens.copy()
        for image in batch.images:
            start = int(batch.offsets[image.datum]) + image.position
            tokens[start : start + image.tokens] = 0
    arrays = [("model_input", tokens)]
    if "target_tokens" in batch.loss_inputs:
        arrays.append(("loss_fn_inputs.target_tokens", batch.loss_inputs["target_tokens"]))
    for label, arr in arrays:
        rows = arr.reshape(len(arr), -1)
        bad_rows = np.flatnonzero(((rows < 0) | (rows >= vocab_size)).any(axis=1))
        if bad_rows.size:
            row = int(bad_rows[0])
            datum = int(np.searchsorted(batch.offsets, row, side="right") - 1)
            bad = rows[row][(rows[row] < 0) | (rows[row] >= vocab_size)][0]
            raise UserError(
                f"data[{datum}].{label} holds token id {int(bad)} outside the vocabulary [0, {vocab_size})",
                field=f"data[{datum}].{label}",
            )
