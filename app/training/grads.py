"""Keeping one operation's gradients apart until it succeeds on every rank, and summing them across ranks."""

from __future__ import annotations

import torch
import torch.distributed as dist


def take_grads(params: list[torch.nn.Parameter]) -> list[torch.Tensor | None]:
    """The gradients accumulated so far, taken off `params` (which start again from none)."""
    taken = [p.grad for p in params]
    for p in params:
        p.grad = None
    return taken


def give_back_grads(
    params: list[torch.nn.Parameter], earlier: list[torch.Tensor | None], *, keep_current: bool
) -> None:
    """Put back what `take_grads` took, with the gradients accumulated since added (`keep_current`) or dropped."""
    for p, before in zip(params, earlier, strict=True):
        if not keep_current or p.grad is None:
            p.grad = before
        elif before is not None:
            p.grad.add_(before)


def failed_on_any_rank(failed: list[bool], device: torch.device) -> list[bool]:
    """For each operation this rank just ran, whether any rank failed it: one small collective every rank joins
    (ranks simulated in one process have no group, and answer for themselves)."""
    if not failed or not dist.is_initialized() or dist.get_world_size() == 1:
        return failed
    flags = torch.tensor([1.0 if f else 0.0 for f in failed], device=device)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    return [bool(f) for f in flags.tolist()]


def all_reduce_sum_grads(params: list[torch.nn.Parameter]) -> None:
    """Sum every rank's gradients of `params` with one collective over a flat buffer."""
    grads: list[torch.Tensor] = []
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grads.append(p.grad)
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()
