"""What a custom loss's operations cost, measured as torch runs them: the FLOPs of every aten op an operation
dispatches (torch's own formulas for matrix products, else the elements it reads and writes) and the elements of
its outputs. The interpreter (app.training.custom_loss.interpreter) runs each operation on the meta device first
(shapes and dtypes, no data, no memory), so a node over the limits is refused before it runs for real. And the
time it takes (`TimeBudget`), the last line: whatever the other bounds miss is stopped at the next node.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.flop_counter import flop_registry


def elements(value: Any) -> int:
    """The elements of the tensors in a value (tuples and lists of them included)."""
    return sum(t.numel() for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor))


class _Counter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.flops = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = flop_registry.get(func._overloadpacket)
        if formula is not None:
            self.flops += int(formula(*args, **kwargs, out_val=out))
        else:
            self.flops += max(elements((args, kwargs)), elements(out))
        return out


def metered(fn: Any, args: list[Any], kwargs: dict[str, Any]) -> tuple[Any, int]:
    """fn's result and the FLOPs it took."""
    with _Counter() as counter:
        out = fn(*args, **kwargs)
    return out, counter.flops


def on_meta(value: Any) -> Any:
    """The value with each tensor replaced by a meta tensor of its shape, dtype and strides (no data, no copy)."""
    with torch.no_grad():
        return tree_map(lambda v: v.to("meta") if isinstance(v, torch.Tensor) else v, value)


class TimeBudget:
    """The seconds a custom loss may take on this rank for one request, counted only while its own code runs
    (`running`: its planning, and its nodes in each pass; not the model's passes between them)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._left = seconds
        self._since: float | None = None

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        self._since = time.monotonic()
        try:
            yield
        finally:
            self._left -= time.monotonic() - self._since
            self._since = None

    def spent(self) -> bool:
        """Whether the loss has taken its seconds (once spent, spent for good)."""
        running = 0.0 if self._since is None else time.monotonic() - self._since
        return self._left - running < 0
