"""The custom loss interpreter: a stored graph computes what the traced function computes, gradients too."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
import torch

from app.errors import LimitExceeded, UserError
from app.training.custom_loss.interpreter import run_custom_loss
from tests.unit.training.custom_loss_graphs import clipped_pg, program

RANKS = {"logprobs": 1, "advantages": 1, "old_logprobs": 1}


def _batch(seed: int = 0) -> tuple[torch.Tensor, dict[str, torch.Tensor], np.ndarray]:
    gen = torch.Generator().manual_seed(seed)
    offsets = np.array([0, 3, 7, 8])
    logprobs = -torch.rand(8, generator=gen) * 3
    inputs = {"advantages": torch.randn(8, generator=gen), "old_logprobs": logprobs.detach() + 0.1 * torch.randn(8)}
    return logprobs, inputs, offsets


def test_loss_metrics_and_gradients_equal_the_direct_torch_computation() -> None:
    logprobs, inputs, offsets = _batch()
    ours = logprobs.clone().requires_grad_(True)
    loss, stats = run_custom_loss(program(clipped_pg, RANKS), ours, inputs, offsets)
    loss.backward()

    direct = logprobs.clone().requires_grad_(True)
    expected, ratios = torch.zeros(()), []
    for lo, hi in itertools.pairwise(offsets):
        datum_loss, metrics = clipped_pg(direct[lo:hi], inputs["advantages"][lo:hi], inputs["old_logprobs"][lo:hi])
        expected = expected + datum_loss
        ratios.append(float(metrics["custom/ratio:mean"].detach()))
    expected.backward()

    assert float(loss) == pytest.approx(float(expected), rel=1e-6)
    assert ours.grad is not None and direct.grad is not None
    torch.testing.assert_close(ours.grad, direct.grad)
    assert stats["custom/ratio:mean"] == (pytest.approx(sum(ratios)), 3.0)
    assert stats["custom/tokens:sum"] == (8.0, 3.0)  # per datum its length; merged as a sum


def test_a_hand_computed_graph() -> None:
    def weighted(logprobs, weights):  # type: ignore[no-untyped-def]
        loss = -(logprobs * weights).sum()
        return loss, {"custom/nll:sum": loss}

    logprobs = torch.tensor([-1.0, -2.0, -0.5], requires_grad=True)
    weights = torch.tensor([1.0, 0.5, 2.0])
    loss, stats = run_custom_loss(
        program(weighted, {"logprobs": 1, "weights": 1}), logprobs, {"weights": weights}, np.array([0, 2, 3])
    )
    loss.backward()
    assert float(loss) == pytest.approx(1.0 + 1.0 + 1.0)  # 1*1 + 0.5*2, then 2*0.5
    assert logprobs.grad is not None and logprobs.grad.tolist() == [-1.0, -0.5, -2.0]  # d/dlp = -weights
    assert stats == {"custom/nll:sum": (pytest.approx(3.0), 2.0)}


def test_rank_two_logprobs() -> None:
    def top(logprobs, target_distribution):  # type: ignore[no-untyped-def]
        return -(logprobs * target_distribution).sum(), {}

    logprobs = torch.log(torch.tensor([[0.5, 0.25], [0.2, 0.7]]))
    dist = torch.tensor([[0.25, 0.75], [1.0, 0.0]])
    loss, _ = run_custom_loss(
        program(top, {"logprobs": 2, "target_distribution": 2}),
        logprobs,
        {"target_distribution": dist},
        np.array([0, 2]),
    )
    assert float(loss) == pytest.approx(float(-(logprobs * dist).sum()))


def test_a_non_scalar_loss_or_a_failing_node_is_a_user_error() -> None:
    def per_token(logprobs):  # type: ignore[no-untyped-def]
        return -logprobs, {}

    with pytest.raises(UserError, match="must return a scalar loss"):
        run_custom_loss(program(per_token, {"logprobs": 1}), torch.zeros(3), {}, np.array([0, 3]))

    def mismatched(logprobs, advantages):  # type: ignore[no-untyped-def]
        return (logprobs[:, None] * advantages).sum(dim=2), {}

    with pytest.raises(UserError, match="node 'sum_1' \\(sum\\) failed") as info:
        run_custom_loss(
            program(mismatched, {"logprobs": 1, "advantages": 1}),
            torch.zeros(3),
            {"advantages": torch.zeros(3)},
            np.array([0, 3]),
        )
    assert info.value.field == "loss_fn_config.loss_id"


def test_intermediates_beyond_the_element_limit_are_refused() -> None:
    def outer(logprobs):  # type: ignore[no-untyped-def]
        return torch.outer(logprobs, logprobs).sum(), {}

    small = replace(program(outer, {"logprobs": 1}), max_elements=1024)
    run_custom_loss(small, torch.zeros(32), {}, np.array([0, 32]))
    with pytest.raises(LimitExceeded, match=r"limits\.max_custom_loss_elements"):
        run_custom_loss(small, torch.zeros(33), {}, np.array([0, 33]))
