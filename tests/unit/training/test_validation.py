"""validate_forward_backward: every rejection names its field; a valid batch returns the resolved config."""

from __future__ import annotations

import numpy as np
import pytest

from app.config import LimitsConfig
from app.errors import LimitExceeded, UserError
from app.training_data.batch import ForwardBackwardInput, PackedBatch
from app.training_data.validation import ModelLimits, ValidLoss, validate_forward_backward

LIMITS = LimitsConfig(max_datums_per_request=4, max_tokens_per_datum=32)
MODEL = ModelLimits(vocab_size=2048, max_context_length=64)


def packed(lengths: list[int], *, k: int | None = None, **extra: np.ndarray) -> PackedBatch:
    total = sum(lengths)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    targets = np.arange(total * (k or 1), dtype=np.int64).reshape((total,) if k is None else (total, k)) % 2048
    inputs = {"target_tokens": targets, **extra}
    return PackedBatch(np.arange(total, dtype=np.int64) % 2048, offsets, inputs)


def request(batch: PackedBatch, loss_fn: str = "cross_entropy", config: dict | None = None) -> ForwardBackwardInput:
    return ForwardBackwardInput("s:train:0", 1, loss_fn, config or {}, False, batch)


def rejected(batch: PackedBatch, exc: type[UserError] = UserError, **kw: object) -> UserError:
    with pytest.raises(exc) as info:
        validate_forward_backward(request(batch, **kw), LIMITS, MODEL)
    return info.value


def test_valid_batch_returns_config() -> None:
    batch = packed([3, 32, 1], weights=np.ones(36, dtype=np.float32))
    assert validate_forward_backward(request(batch), LIMITS, MODEL) == ValidLoss("cross_entropy", {})
    soft = packed([2, 2], k=4, weights=np.full((4, 4), 0.25, dtype=np.float32))
    assert validate_forward_backward(request(soft), LIMITS, MODEL) == ValidLoss("cross_entropy", {})


def test_too_many_datums() -> None:
    err = rejected(packed([1] * 5), LimitExceeded)
    assert err.field == "data"
    assert "5" in err.message and "max_datums_per_request=4" in err.message


def test_too_long_datum_names_it() -> None:
    assert rejected(packed([2, 33, 40]), LimitExceeded).field == "data[1].model_input"


def test_context_length_caps_the_limit() -> None:
    model = ModelLimits(vocab_size=2048, max_context_length=8)
    with pytest.raises(LimitExceeded) as info:
        validate_forward_backward(request(packed([8, 9])), LIMITS, model)
    assert info.value.field == "data[1].model_input"
    assert "limit is 8" in info.value.message


def test_without_a_limit_a_datum_may_fill_the_context() -> None:
    unlimited = LimitsConfig(max_datums_per_request=4)  # max_tokens_per_datum: None, the base's context
    assert validate_forward_backward(request(packed([64])), unlimited, MODEL) == ValidLoss("cross_entropy", {})
    with pytest.raises(LimitExceeded, match="limit is 64"):
        validate_forward_backward(request(packed([65])), unlimited, MODEL)


def test_empty_datum() -> None:
    assert rejected(packed([2, 0, 1])).field == "data[1].model_input"


def test_model_input_token_outside_vocab() -> None:
    batch = packed([3, 4, 2])
    batch.tokens[5] = 2048  # datum 1 (rows 3..6)
    err = rejected(batch)
    assert err.field == "data[1].model_input"
    assert "2048" in err.message


def test_target_token_outside_vocab() -> None:
    batch = packed([3, 4, 2])
    batch.loss_inputs["target_tokens"][8] = 5000  # datum 2 (rows 7..8)
    assert rejected(batch).field == "data[2].loss_fn_inputs.target_tokens"


def test_negative_token_id() -> None:
    batch = packed([3, 4, 2])
    batch.tokens[0] = -1
    err = rejected(batch)
    assert err.field == "data[0].model_input" and "-1" in err.message


def test_2d_target_outside_vocab() -> None:
    batch = packed([2, 3], k=2)
    batch.loss_inputs["target_tokens"][4, 1] = 2048
    assert rejected(batch).field == "data[1].loss_fn_inputs.target_tokens"


def test_missing_target_tokens() -> None:
    batch = PackedBatch(np.arange(3, dtype=np.int64), np.array([0, 3]), {"weights": np.ones(3, np.float32)})
    assert rejected(batch).field == "loss_fn_inputs.target_tokens"


def test_unused_input() -> None:
    err = rejected(packed([3], advantages=np.ones(3, dtype=np.float32)))
    assert err.field == "loss_fn_inputs.advantages"


def test_nan_weights() -> None:
    weights = np.ones(4, dtype=np.float32)
    weights[2] = np.nan
    assert rejected(packed([4], weights=weights)).field == "loss_fn_inputs.weights"
    weights[2] = np.inf
    assert rejected(packed([4], weights=weights)).field == "loss_fn_inputs.weights"


def test_weights_shape_mismatch() -> None:
    assert rejected(packed([2, 2], k=3, weights=np.ones(4, np.float32))).field == "loss_fn_inputs.weights"
    assert rejected(packed([2, 2], weights=np.ones((4, 2), np.float32))).field == "loss_fn_inputs.weights"


def test_unknown_loss_and_config() -> None:
    assert rejected(packed([2]), loss_fn="dpo").field == "loss_fn"
    assert rejected(packed([2]), config={"beta": 0.1}).field == "loss_fn_config"


def critic_batch(lengths: list[int], **inputs: np.ndarray) -> PackedBatch:
    total = sum(lengths)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return PackedBatch(np.arange(total, dtype=np.int64) % 2048, offsets, inputs)


def critic(
    batch: PackedBatch, loss_fn: str = "ppo", *, forward_only: bool = False, config: dict | None = None
) -> ValidLoss:
    return validate_forward_backward(
        ForwardBackwardInput("s:train:1", 1, loss_fn, config or {}, forward_only, batch), LIMITS, MODEL, role="critic"
    )


def test_critic_ppo_is_the_value_loss() -> None:
    values = {"values": np.zeros(5, np.float32), "returns": np.ones(5, np.float32)}
    assert critic(critic_batch([2, 3], **values)) == ValidLoss("ppo_critic", {"value_clip": 0.2})
    assert critic(critic_batch([5], **values), "ppo_critic", config={"value_clip": 0.5}).config == {"value_clip": 0.5}
    with_targets = critic_batch([5], **values, target_tokens=np.arange(5), weights=np.ones(5, np.float32))
    assert critic(with_targets).name == "ppo_critic"


def test_critic_forward_may_omit_inputs_but_training_may_not() -> None:
    assert critic(critic_batch([3]), forward_only=True).name == "ppo_critic"
    with pytest.raises(UserError) as info:
        critic(critic_batch([3]))
    assert info.value.field == "loss_fn_inputs.returns"
    with pytest.raises(UserError) as info:  # half the inputs: a mistake even in a forward
        critic(critic_batch([3], values=np.zeros(3, np.float32)), forward_only=True)
    assert info.value.field == "loss_fn_inputs.returns"


@pytest.mark.parametrize(
    ("loss_fn", "role"), [("cross_entropy", "critic"), ("importance_sampling", "critic"), ("ppo_critic", "policy")]
)
def test_loss_must_suit_the_role(loss_fn: str, role: str) -> None:
    inp = ForwardBackwardInput("s:train:0", 1, loss_fn, {}, False, packed([2]))
    with pytest.raises(UserError) as info:
        validate_forward_backward(inp, LIMITS, MODEL, role=role)
    assert info.value.field == "loss_fn" and role in info.value.message


def test_critic_rejects_policy_inputs_and_bad_shapes() -> None:
    values = {"values": np.zeros(3, np.float32), "returns": np.ones(3, np.float32)}
    with pytest.raises(UserError) as info:
        critic(critic_batch([3], **values, advantages=np.ones(3, np.float32)))
    assert info.value.field == "loss_fn_inputs.advantages"
    with pytest.raises(UserError) as info:
        critic(critic_batch([3], values=np.zeros((3, 2), np.float32), returns=np.ones(3, np.float32)))
    assert info.value.field == "loss_fn_inputs.values"
    with pytest.raises(UserError) as info:
        critic(critic_batch([3], **values), config={"clip_low_threshold": 0.8})
    assert info.value.field == "loss_fn_config"
