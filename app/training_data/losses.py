"""Loss registry: each Tinker loss name with the inputs and config keys it accepts (no torch here: the ingress
validates against it). The functions that compute them are in app.training.losses.functions.

Every loss is a sum over tokens and datums (Tinker never averages); users fold normalisation into
weights or advantages. Policies score target tokens (the loss sees logprobs); critics predict values
(the loss sees values), and `ppo` sent to a critic means its value loss, `ppo_critic`.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.errors import UserError


@dataclass(frozen=True)
class LossSpec:
    required_inputs: frozenset[str]
    optional_inputs: frozenset[str] = frozenset()
    config_defaults: dict[str, float] | None = None
    allows_2d_targets: bool = False
    role: str = "policy"  # the model role the loss trains
    forward_needs_inputs: bool = True  # False: a forward may omit the inputs and get only the prediction
    needs_provenance: bool = False  # True: datums carry spans naming stability records (stable_reinforce)


CUSTOM = "custom"
_POLICY_INPUTS = frozenset({"target_tokens", "logprobs", "advantages"})
_PPO_CLIP = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}

LOSSES: dict[str, LossSpec] = {
    "cross_entropy": LossSpec(
        required_inputs=frozenset({"target_tokens"}),
        optional_inputs=frozenset({"weights"}),
        allows_2d_targets=True,
    ),
    "importance_sampling": LossSpec(required_inputs=_POLICY_INPUTS, config_defaults={}),
    "ppo": LossSpec(required_inputs=_POLICY_INPUTS, config_defaults=_PPO_CLIP),
    "cispo": LossSpec(
        required_inputs=_POLICY_INPUTS, config_defaults={"clip_low_threshold": 0.0, "clip_high_threshold": 4.0}
    ),
    "dro": LossSpec(required_inputs=_POLICY_INPUTS, config_defaults={"beta": 0.05}),
    # The GSPO paper's clip range (1 - 3e-4, 1 + 4e-4): sequence ratios sit much closer to 1 than token ones.
    "gspo": LossSpec(
        required_inputs=_POLICY_INPUTS | {"sequence_ratio_mask"},
        config_defaults={"clip_low_threshold": 1 - 3e-4, "clip_high_threshold": 1 + 4e-4},
    ),
    "ppo_critic": LossSpec(
        required_inputs=frozenset({"values", "returns"}),
        optional_inputs=frozenset({"weights", "target_tokens"}),  # target_tokens: ignored
        config_defaults={"value_clip": 0.2},
        role="critic",
        forward_needs_inputs=False,
    ),
    # The sampler's logprobs come from the stability records the spans name (app.training_data.provenance); a client's
    # own `logprobs` are accepted and not used.
    # A loss made by create_custom_loss, named by loss_fn_config.loss_id; its inputs are the ones it declared
    # (app.training_data.validation), and it runs through app.training.custom_loss, not LOSS_FUNCTIONS.
    CUSTOM: LossSpec(required_inputs=frozenset({"target_tokens"}), allows_2d_targets=True),
    "stable_reinforce": LossSpec(
        required_inputs=frozenset({"target_tokens", "advantages"}),
        optional_inputs=frozenset({"logprobs"}),
        # The band: with [0.2, 5], one of three runs of the cookbook's async loop (max_steps_off_policy=2, lr 5e-3)
        # collapsed on the toy task; with [0.5, 2], three of three learned.
        config_defaults={"kl_coeff": 0.0, "ratio_cap": 2.0, "mask_low": 0.5, "mask_high": 2.0},
        needs_provenance=True,
    ),
}
# stable_reinforce's inputs that the server adds from stability records (users cannot send them: unknown names)
SAMPLER_LOGPROBS, SAMPLED_MASK = "sampler_logprobs", "sampled_mask"
_CRITIC_ALIASES = {"ppo": "ppo_critic"}  # what a PPO client sends to its critic


def get_loss(name: str) -> LossSpec:
    spec = LOSSES.get(name)
    if spec is None:
        raise UserError(f"unknown loss_fn {name!r}; supported: {sorted(LOSSES)}", field="loss_fn")
    return spec


def loss_for_role(name: str, role: str) -> str:
    """The loss a model of `role` trains when asked for `name`; a user error when that role has no such loss."""
    resolved = _CRITIC_ALIASES.get(name, name) if role == "critic" else name
    spec = get_loss(resolved)
    if spec.role != role:
        accepted = sorted(n for n, s in LOSSES.items() if s.role == role)
        if role == "critic":
            accepted = sorted([*accepted, *_CRITIC_ALIASES])
        raise UserError(f"loss_fn {name!r} does not train a {role} model; accepted: {accepted}", field="loss_fn")
    return resolved


def resolve_config(name: str, config: dict[str, float | str]) -> dict[str, float]:
    """The loss's config with defaults filled in; unknown keys or non-numbers are user errors."""
    defaults = get_loss(name).config_defaults or {}
    unknown = sorted(set(config) - set(defaults))
    if unknown:
        raise UserError(
            f"loss_fn_config keys {unknown} are not used by {name!r}; accepted: {sorted(defaults)}",
            field="loss_fn_config",
        )
    resolved = dict(defaults)
    for key, value in config.items():
        if not isinstance(value, (int, float)):
            raise UserError(f"loss_fn_config.{key} must be a number, got {value!r}", field=f"loss_fn_config.{key}")
        resolved[key] = float(value)
    return resolved
