"""The LoRA deltas of one adapted layer for rows that belong to different adapters (app.training.lora.AdapterPool.
segments): the rows come in consecutive runs, one per adapter. Adapters of the same rank are computed together, as
two batched matmuls over their runs (each run padded to the longest), so the number of kernels per layer does not
grow with the number of adapters; a run whose adapter does not adapt this layer gets zeros.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from peft.tuners.lora.layer import Linear as LoraLinear


def segment_deltas(module: LoraLinear, runs: list[tuple[str, int]], x: torch.Tensor, out: int) -> torch.Tensor:
    """[rows, ..., out]: for each run of `x`'s rows ([rows, ..., in]), its adapter's `B(A(x)) * scaling`."""
    parts = x.split([rows for _, rows in runs])
    by_rank: dict[int, list[int]] = {}
    for i, (name, _) in enumerate(runs):
        if name in module.lora_A:
            by_rank.setdefault(int(module.r[name]), []).append(i)
    deltas: list[torch.Tensor | None] = [None] * len(runs)
    for members in by_rank.values():
        grouped = _grouped(module, runs, x, parts, members)
        if len(members) == len(runs) and grouped.shape[1] * len(runs) == x.shape[0]:  # every run, none padded
            return grouped.reshape(*x.shape[:-1], out)
        sizes = [parts[i].shape[0] for i in members]
        for i, delta, size in zip(members, grouped.unbind(), sizes, strict=True):
            deltas[i] = delta[:size]
    return torch.cat(
        [d if d is not None else p.new_zeros((*p.shape[:-1], out)) for p, d in zip(parts, deltas, strict=True)]
    )


def _grouped(
    module: LoraLinear,
    runs: list[tuple[str, int]],
    x: torch.Tensor,
    parts: tuple[torch.Tensor, ...],
    members: list[int],
) -> torch.Tensor:
    """The deltas of the runs `members` (adapters of one rank), [G, longest, ..., out]: each run padded to the
    longest, x @ A^T @ B^T, scaled."""
    names = [runs[i][0] for i in members]
    a = torch.stack([cast(torch.Tensor, module.lora_A[n].weight) for n in names])  # [G, r, in]
    sizes = [parts[i].shape[0] for i in members]
    longest = max(sizes)
    if len(members) == len(parts) and longest * len(parts) == x.shape[0]:  # every run, none padded: a view of x
        xs = x.view(len(parts), longest, *x.shape[1:])
    else:
        xs = torch.stack([_padded(parts[i], longest) for i in members])
    inner = xs.shape[2:-1]
    flat = module._cast_input_dtype(xs.reshape(len(members), -1, xs.shape[-1]), a.dtype)
    # the scalings as Python floats (a tensor of them would be a copy to the device that waits for it)
    scales = [float(module.scaling[n]) for n in names]
    same = len(set(scales)) == 1
    b = torch.stack([cast(torch.Tensor, module.lora_B[n].weight) * (1.0 if same else s) for n, s in zip(names, scales)])
    deltas = torch.bmm(torch.bmm(flat, a.transpose(1, 2)), b.transpose(1, 2))  # [G, rows, out]
    if same:
        deltas = deltas * scales[0]
    return deltas.view(len(members), longest, *inner, -1)


def _padded(part: torch.Tensor, rows: int) -> torch.Tensor:
    """`part` with zero rows appended up to `rows` (itself when it has them)."""
    missing = rows - part.shape[0]
    return part if missing == 0 else F.pad(part, (0, 0) * (part.dim() - 1) + (0, missing))
