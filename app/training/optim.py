"""Adam hyper-parameters as Tinker sends them (app.messages.AdamParams), applied per step to a torch AdamW."""

from __future__ import annotations

import torch

from app.messages import AdamParams


def make_optimizer(params: list[torch.nn.Parameter]) -> torch.optim.AdamW:
    # Hyper-parameters are overwritten on every step; these are placeholders.
    return torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), eps=1e-12, weight_decay=0.0, foreach=True)


def apply_step(optimizer: torch.optim.AdamW, params: list[torch.nn.Parameter], hp: AdamParams) -> float:
    """Clip (if asked), step with `hp`, clear gradients; returns the global gradient norm before clipping."""
    grads = [p.grad for p in params if p.grad is not None]
    norm = float(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))) if grads else 0.0
    if hp.grad_clip_norm > 0 and norm > hp.grad_clip_norm:
        scale = hp.grad_clip_norm / (norm + 1e-6)
        torch._foreach_mul_(grads, scale)
    for group in optimizer.param_groups:
        group.update(lr=hp.learning_rate, betas=(hp.beta1, hp.beta2), eps=hp.eps, weight_decay=hp.weight_decay)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return norm
