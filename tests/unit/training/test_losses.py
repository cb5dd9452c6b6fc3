"""cross_entropy math against hand-computed values, and the loss registry's user errors."""

from __future__ import annotations

import math

import pytest
import torch

from app.errors import UserError
from app.training.losses.cross_entropy import cross_entropy
from app.training_data.losses import CUSTOM, LOSSES, get_loss, resolve_config


def test_cross_entropy_1d_weighted() -> None:
    lp = torch.tensor([-1.0, -2.0, -0.5])
    w = torch.tensor([1.0, 0.0, 2.0])
    loss, elementwise = cross_entropy(lp, {"weights": w}, {})
    # -(1*-1) - (0*-2) - (2*-0.5) = 1 + 0 + 1 = 2
    assert loss.item() == pytest.approx(2.0)
    assert elementwise.tolist() == pytest.approx([1.0, 0.0, 1.0])


def test_cross_entropy_default_weights_are_ones() -> None:
    lp = torch.tensor([math.log(0.5), math.log(0.25)])
    loss, elementwise = cross_entropy(lp, {}, {})
    assert loss.item() == pytest.approx(math.log(2) + math.log(4))
    assert elementwise.tolist() == pytest.approx([math.log(2), math.log(4)])


def test_cross_entropy_2d_targets() -> None:
    lp = torch.tensor([[-1.0, -3.0], [-0.25, -4.0]])
    w = torch.tensor([[0.5, 0.5], [1.0, 0.0]])
    loss, elementwise = cross_entropy(lp, {"weights": w}, {})
    # 0.5 + 1.5 + 0.25 + 0 = 2.25
    assert loss.item() == pytest.approx(2.25)
    assert elementwise.shape == (2, 2)
    assert elementwise.flatten().tolist() == pytest.approx([0.5, 1.5, 0.25, 0.0])


def test_cross_entropy_gradient_is_minus_weights() -> None:
    lp = torch.tensor([-1.0, -2.0], requires_grad=True)
    loss, _ = cross_entropy(lp, {"weights": torch.tensor([3.0, 0.5])}, {})
    loss.backward()
    assert lp.grad.tolist() == pytest.approx([-3.0, -0.5])


def test_registry_lists_cross_entropy() -> None:
    spec = get_loss("cross_entropy")
    assert spec is LOSSES["cross_entropy"]
    assert spec.required_inputs == {"target_tokens"}
    assert spec.optional_inputs == {"weights"}
    assert spec.allows_2d_targets


def test_unknown_loss_names_loss_fn() -> None:
    with pytest.raises(UserError) as info:
        get_loss("ppo_but_spelled_wrong")
    assert info.value.field == "loss_fn"
    assert "ppo_but_spelled_wrong" in info.value.message
    assert info.value.status_code == 400


def test_resolve_config_empty_is_empty_for_cross_entropy() -> None:
    assert resolve_config("cross_entropy", {}) == {}


def test_resolve_config_rejects_unknown_keys() -> None:
    with pytest.raises(UserError) as info:
        resolve_config("cross_entropy", {"clip_eps": 0.2})
    assert info.value.field == "loss_fn_config"
    assert "clip_eps" in info.value.message


def test_resolve_config_fills_defaults_and_rejects_non_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    # A loss with config keys, registered for this test only, exercises the default/number paths.
    spec = LOSSES["cross_entropy"]
    fake = type(spec)(spec.required_inputs, spec.optional_inputs, {"beta": 0.1, "eps": 0.2})
    monkeypatch.setitem(LOSSES, "with_config", fake)
    assert resolve_config("with_config", {"beta": 1}) == {"beta": 1.0, "eps": 0.2}
    with pytest.raises(UserError) as info:
        resolve_config("with_config", {"eps": "big"})
    assert info.value.field == "loss_fn_config.eps"


def test_resolve_config_unknown_loss() -> None:
    with pytest.raises(UserError) as info:
        resolve_config("nope", {})
    assert info.value.field == "loss_fn"


def test_every_registered_loss_has_a_function_and_no_function_is_unregistered() -> None:
    from app.training.losses.functions import LOSS_FUNCTIONS

    assert LOSS_FUNCTIONS.keys() == LOSSES.keys() - {CUSTOM}  # custom losses run through their interpreter
