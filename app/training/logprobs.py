"""Log-probabilities of target tokens from a [T, V] block of logits, in float32.

For float32 logits on the CPU this is the plain autograd expression: logsumexp and a gather. For bfloat16 logits (a
bf16 base, on a GPU or a CPU) that expression keeps a float32 copy of all of them for the backward pass and builds the
gradient out of several more [T, V] float32 tensors: with Qwen2.5's 151936-token vocabulary, 16 x 512 tokens on an
H100 peaked at 40.6 GiB (bench/gpu_lora_step.py). There the fused log-softmax and softmax kernels run over blocks of
rows instead: the saved tensor is the logits themselves (the model made them anyway), the forward reads them once,
and the backward recomputes a block's softmax and writes the gradient in the logits' dtype (23.5 GiB, and 18 ms less
kernel time per step). Equal to the plain expression up to float32 rounding.
"""

from __future__ import annotations

from typing import Any

import torch

_BLOCK_ELEMENTS = 1 << 27  # float32 temporaries of at most 512 MiB each


def _row_blocks(rows: int, vocab: int) -> list[tuple[int, int]]:
    step = max(1, _BLOCK_ELEMENTS // max(vocab, 1))
    return [(start, min(start + step, rows)) for start in range(0, rows, step)]


class _BlockedTargetLogprobs(torch.autograd.Function):
    """log_softmax(logits)[t, targets[t, k]] as float32 [T, K], over blocks of rows."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        out = torch.empty(targets.shape, dtype=torch.float32, device=logits.device)
        for start, stop in _row_blocks(*logits.shape):
            log_probs = torch.log_softmax(logits[start:stop], dim=-1, dtype=torch.float32)
            out[start:stop] = log_probs.gather(1, targets[start:stop])
        ctx.save_for_backward(logits, targets)
        return out

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor, None]:
        # d out[t, k] / d logits[t, v] = [v == targets[t, k]] - softmax(logits[t])[v]
        logits, targets = ctx.saved_tensors
        grad = grads[0].float()
        neg_total = -grad.sum(1, keepdim=True)
        grad_logits = torch.empty_like(logits)
        for start, stop in _row_blocks(*logits.shape):
            block = torch.softmax(logits[start:stop], dim=-1, dtype=torch.float32).mul_(neg_total[start:stop])
            grad_logits[start:stop] = block.scatter_add_(1, targets[start:stop], grad[start:stop])
        return grad_logits, None


def target_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """float32 log-softmax of `logits` [T, V] at `targets` ([T] or [T, K] token ids): [T] or [T, K]."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        flat_logits = logits.float()
        log_norm = torch.logsumexp(flat_logits, dim=-1)
        if targets.dim() == 1:
            return flat_logits.gather(1, targets[:, None]).squeeze(1) - log_norm
        return flat_logits.gather(1, targets) - log_norm[:, None]
    out: torch.Tensor = _BlockedTargetLogprobs.apply(logits, targets[:, None] if targets.dim() == 1 else targets)
    return out.squeeze(1) if targets.dim() == 1 else out
