"""Dimuon: Muon (momentum orthogonalised by a Newton-Schulz iteration) for LoRA matrices, as Tinker's
`DimuonParams` describes it: `learning_rate` is applied to a direction of Frobenius norm sqrt(rank).

Per parameter matrix W (a LoRA A is r x d_in, a B is d_out x r), each step:

    m <- beta1 * m + (1 - beta1) * g                  momentum, an EMA of the gradient
    O <- NS5(m)                                       ~ U V^T of m = U S V^T: every singular value pushed to ~1
    W <- W - lr * sqrt(r) * O / ||O||_F               r = min(rows, cols): the LoRA rank for A and B

NS5 is the quintic Newton-Schulz iteration (5 steps, coefficients 3.4445, -4.7750, 2.0315, as in Keller Jordan's
Muon) on m / ||m||_F. A and B are orthogonalised separately, each in its own shape, so both take a rank-r step of
the same size whatever the adapted layer's width. A zero momentum (a LoRA A before B has moved) takes no step.
Parameters that are not matrices (a critic's value-head bias) are treated as 1 x n matrices, whose orthogonal
direction is m / ||m||. There is no weight decay (DimuonParams has none); the SDK's rank correction relative to
rank 32 is not part of its 0.38 parameters and is not applied.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5
_EPS = 1e-7


def orthogonalize(m: torch.Tensor, steps: int = NS_STEPS) -> torch.Tensor:
    """The Newton-Schulz approximation of U V^T for a 2-D `m` (zero for a zero `m`)."""
    a, b, c = NS_COEFFICIENTS
    x = m.float()
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T  # iterate on the small Gram matrix
    x = x / (torch.linalg.matrix_norm(x) + _EPS)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


def direction(m: torch.Tensor) -> torch.Tensor:
    """The step direction of one parameter: NS5(m) rescaled to Frobenius norm sqrt(min(rows, cols))."""
    matrix = m.reshape(1, -1) if m.dim() < 2 else m.reshape(m.shape[0], -1)
    ortho = orthogonalize(matrix)
    norm = torch.linalg.matrix_norm(ortho)
    if float(norm) == 0.0:
        return torch.zeros_like(m)
    scale = math.sqrt(min(matrix.shape)) / norm
    return (ortho * scale).reshape(m.shape).to(m.dtype)


class Dimuon(torch.optim.Optimizer):
    """The update above; `lr` and `beta1` are set per step (app.training.optim), its state is each parameter's
    momentum (saved with training checkpoints like AdamW's)."""

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float = 1e-4, beta1: float = 0.9) -> None:
        super().__init__(params, {"lr": lr, "beta1": beta1})

    @torch.no_grad()
    def step(self, closure: None = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            lr, beta1 = group["lr"], group["beta1"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum" not in state:
                    state["momentum"] = torch.zeros_like(p)
                m = state["momentum"]
                m.mul_(beta1).add_(p.grad, alpha=1 - beta1)
                p.add_(direction(m), alpha=-lr)
