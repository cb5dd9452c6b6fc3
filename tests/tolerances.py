"""Tolerances for floats the code computes two ways that are equal in exact arithmetic, only in another order of
additions (one GEMM over many rows or one per model, micro-batches, shards, a chunked kernel against a loop).

A float sum of n terms taken in another order moves by up to ~n x eps of the sum of the terms' magnitudes (the
worst case, Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., section 4.2); rounding errors are
rarely all of one sign, so in practice the difference grows like sqrt(n) x eps (Higham's rule of thumb). Through a
network the sums feed one another and the differences compound, so `terms` is the count of additions along a value's
longest chain: the contraction lengths of every layer it passes through (`network_terms`), twice for a gradient (the
backward pass mirrors the forward one). The bound used is

    rtol = SAFETY x eps(dtype) x sqrt(terms),    atol = rtol x magnitude,

where `magnitude` is the size of the terms summed: a sum that nearly cancels keeps the rounding of its large terms,
so an element is judged against its tensor's scale (its largest magnitude, the default), not only its own value.
SAFETY = 32 covers the largest difference seen where the same test ran on three machines of one kind (a mixed pass's
gradients: 6e-5 of the tensor's scale on one; 2e-6 to 4e-6 on another under MKL's and ATen's AVX-512, AVX2 and
baseline kernels, MKL_CBWR=COMPATIBLE and one thread; the bound there is 3e-4) and stays below a real error: a wrong
row, datum or adapter moves a value by O(1) of its scale, and 1e-3 of the scale added to one element is still caught
(checked on every gradient tensor of test_mixed_pass and on test_cpu_gdn's outputs).
Where the code promises bit-for-bit equality (a replay of the same passes, a recovery, a codec round trip, a load of
the same bytes) the tests compare exactly and say why; this module is for everything else.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

SAFETY = 32.0


@dataclass(frozen=True)
class Tolerance:
    """Relative and absolute tolerance, as numpy's, torch's and pytest's comparisons take them."""

    rtol: float
    atol: float

    def approx(self, want: Any) -> Any:
        return pytest.approx(want, rel=self.rtol, abs=self.atol)

    def assert_close(self, got: Any, want: Any, err_msg: str = "") -> None:
        np.testing.assert_allclose(_numpy(got), _numpy(want), rtol=self.rtol, atol=self.atol, err_msg=err_msg)


def _numpy(values: Any) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        return values.detach().float().numpy() if values.dtype == torch.bfloat16 else values.detach().numpy()
    return np.asarray(values)


def eps(dtype: torch.dtype | np.dtype | type) -> float:
    """The machine epsilon of a torch or numpy float dtype."""
    return float(torch.finfo(dtype).eps if isinstance(dtype, torch.dtype) else np.finfo(dtype).eps)


def sum_tolerance(dtype: torch.dtype | np.dtype | type, terms: int, magnitude: float) -> Tolerance:
    """How far two orders of the same float sums of `terms` terms of about `magnitude` may fall apart (module
    docstring)."""
    rtol = SAFETY * eps(dtype) * math.sqrt(terms)
    return Tolerance(rtol, rtol * magnitude)


def assert_sums_close(
    got: Any, want: Any, terms: int, dtype: torch.dtype | np.dtype | type | None = None, err_msg: str = ""
) -> None:
    """`got` equals `want` up to the order of float additions: `sum_tolerance` at `want`'s dtype (or `dtype`, for
    values computed in another precision than they are held in), `want`'s largest magnitude as the terms' size."""
    expected = _numpy(want)
    magnitude = float(np.abs(expected).max()) if expected.size else 0.0
    sum_tolerance(dtype or expected.dtype, terms, magnitude).assert_close(got, expected, err_msg)


def network_terms(model_dir: Path) -> int:
    """The additions along a forward pass's longest chain through a Hugging Face causal LM: per layer the attention
    and MLP contractions (hidden, intermediate, hidden), then the vocabulary's softmax."""
    config = json.loads((model_dir / "config.json").read_text())
    per_layer = 2 * config["hidden_size"] + config["intermediate_size"]
    return config["num_hidden_layers"] * per_layer + config["vocab_size"]
