"""Target log-probabilities: the blocked kernel path GPUs take equals the CPU expression; unpadding equals a mask."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from app.training import logprobs
from app.training.rows import unpadded
from tests.tolerances import assert_sums_close


def _cpu_expression(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    log_norm = torch.logsumexp(logits.float(), dim=-1)
    if targets.dim() == 1:
        return logits.float().gather(1, targets[:, None]).squeeze(1) - log_norm
    return logits.float().gather(1, targets) - log_norm[:, None]


@pytest.mark.parametrize("k", [None, 3])
@pytest.mark.parametrize("block_elements", [1 << 27, 300])  # one block; blocks of 3 rows
def test_blocked_path_matches_cpu_expression(
    monkeypatch: pytest.MonkeyPatch, k: int | None, block_elements: int
) -> None:
    monkeypatch.setattr(logprobs, "_BLOCK_ELEMENTS", block_elements)
    gen = torch.Generator().manual_seed(0)
    rows, vocab = 23, 97
    logits = torch.randn(rows, vocab, generator=gen) * 3
    targets = torch.randint(0, vocab, (rows,) if k is None else (rows, k), generator=gen)
    if k is not None:
        targets[:, 1] = targets[:, 0]  # a token twice in a row's targets: its gradients add up
    weights = torch.randn(targets.shape, generator=gen)
    results = []
    for blocked in (False, True):
        x = logits.clone().requires_grad_(True)
        t2 = targets[:, None] if targets.dim() == 1 else targets
        out = logprobs._BlockedTargetLogprobs.apply(x, t2) if blocked else _cpu_expression(x, targets)
        out = out.squeeze(1) if blocked and targets.dim() == 1 else out
        (weights * out).sum().backward()
        results.append((out.detach(), x.grad))
    (out_cpu, grad_cpu), (out_blocked, grad_blocked) = results
    assert_sums_close(out_blocked, out_cpu, vocab)  # the vocabulary's logsumexp, summed by blocks
    assert_sums_close(grad_blocked, grad_cpu, vocab)


def test_cpu_takes_the_plain_expression() -> None:
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(5, 11, generator=gen)
    targets = torch.randint(0, 11, (5,), generator=gen)
    # exact: on the CPU target_logprobs runs this very expression
    assert torch.equal(logprobs.target_logprobs(logits, targets), _cpu_expression(logits, targets))


@pytest.mark.parametrize("lengths", [[4, 4, 4], [4, 1, 3]])
def test_unpadded_equals_the_masked_rows(lengths: list[int]) -> None:
    padded = torch.randn(len(lengths), max(lengths), 6)
    mask = torch.zeros(padded.shape[:2], dtype=torch.bool)
    for i, length in enumerate(lengths):
        mask[i, :length] = True
    assert torch.equal(unpadded(padded, np.array(lengths)), padded[mask])
