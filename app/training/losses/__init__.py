"""Loss registry: Tinker loss names -> pure functions, with the inputs and config keys each accepts.

Every loss is a sum over tokens and datums (Tinker never averages); users fold normalisation into
weights or advantages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from app.errors import UserError
from app.training.losses.cross_entropy import cross_entropy

# (target logprobs [T] or [T, K], loss inputs by name, config) -> (summed loss, elementwise loss [T] or [T, K])
LossFn = Callable[[torch.Tensor, dict[str, torch.Tensor], dict[str, float]], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class LossSpec:
    fn: LossFn
    required_inputs: frozenset[str]
    optional_inputs: frozenset[str] = frozenset()
    config_defaults: dict[str, float] | None = None
    allows_2d_targets: bool = False


LOSSES: dict[str, LossSpec] = {
    "cross_entropy": LossSpec(
        cross_entropy, required_inputs=frozenset({"target_tokens"}), optional_inputs=frozenset({"weights"}),
        allows_2d_targets=True,
    ),
}


def get_loss(name: str) -> LossSpec:
    spec = LOSSES.get(name)
    if spec is None:
        raise UserError(f"unknown loss_fn {name!r}; supported: {sorted(LOSSES)}", field="loss_fn")
    return spec


def resolve_config(name: str, config: dict[str, float | str]) -> dict[str, float]:
    """The loss's config with defaults filled in; unknown keys or non-numbers are user errors."""
    defaults = get_loss(name).config_defaults or {}
    unknown = sorted(set(config) - set(defaults))
    if unknown:
        raise UserError(f"loss_fn_config keys {unknown} are not used by {name!r}; accepted: {sorted(defaults)}",
                        field="loss_fn_config")
    resolved = dict(defaults)
    for key, value in config.items():
        if not isinstance(value, (int, float)):
            raise UserError(f"loss_fn_config.{key} must be a number, got {value!r}", field=f"loss_fn_config.{key}")
        resolved[key] = float(value)
    return resolved
