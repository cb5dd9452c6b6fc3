"""A custom loss graph's node, as the SDK's graph gives it (validated by app.training_data.custom_losses, checked
for its operands by app.training_data.custom_loss_operands, run by app.training.custom_loss.interpreter)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LossNode:
    op: str  # placeholder, call_function, call_method or output
    name: str
    target: str
    args: list[Any]  # encoded as the SDK sends them ({"ref": name}, {"tuple": [...]}, ...)
    kwargs: dict[str, Any]
