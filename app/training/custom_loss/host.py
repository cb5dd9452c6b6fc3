"""Arithmetic a custom loss does on the host (`operator.*` and `math.*` nodes), checked as it runs, before each
node and after: every operand a tensor or a plain number (a shape, tuple, list or string times 10**8 would be built
on every rank), math on numbers only, and with no tensor operand every integer within
limits.max_custom_loss_integer, a power refused before it computes one past it. So a node on plain numbers costs a
few machine words, whatever the graph chains; a node with a tensor is torch's, metered by
app.training.custom_loss.budget.

create_custom_loss refuses what the graph alone shows (app.training_data.custom_loss_operands); this holds for the
values only the data tells (a size read from a shape), and for losses stored before those checks.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from app.errors import LimitExceeded, UserError

_FIELD = "loss_fn_config.loss_id"
_OPERANDS = (torch.Tensor, bool, int, float)


def check_operands(where: str, target: str, args: list[Any], kwargs: dict[str, Any], max_integer: int) -> None:
    """Refuse an arithmetic node (app.training_data.custom_loss_operands.arithmetic) before it runs."""
    operands = [*args, *kwargs.values()]
    for i, value in enumerate(operands):
        if not isinstance(value, _OPERANDS):
            raise UserError(
                f"{where} takes tensors and numbers; its operand {i} is a {type(value).__name__}", field=_FIELD
            )
    if not any(isinstance(value, torch.Tensor) for value in operands):
        for value in operands:
            _check_integer(where, value, max_integer)
        if target == "operator.pow" and len(args) == 2 and _power_bits(*args) > max_integer.bit_length():
            raise LimitExceeded(
                f"{where} would compute an integer past limits.max_custom_loss_integer ({max_integer})", field=_FIELD
            )
    elif target.startswith("math."):
        raise UserError(f"{where} applies math to a tensor, which leaves autograd; use torch", field=_FIELD)


def check_result(where: str, value: Any, max_integer: int) -> None:
    """Refuse an arithmetic node's result past the integer bound (the next node would grow it further)."""
    _check_integer(where, value, max_integer)


def _check_integer(where: str, value: Any, max_integer: int) -> None:
    if isinstance(value, int) and abs(value) > max_integer:
        raise LimitExceeded(
            f"{where} holds an integer of {value.bit_length()} bits; limits.max_custom_loss_integer is {max_integer}",
            field=_FIELD,
        )


def _power_bits(base: Any, exponent: Any) -> float:
    """At least the bits of base ** exponent when both are integers (a float power costs one float operation)."""
    if not (isinstance(base, int) and isinstance(exponent, int)) or exponent <= 0 or abs(base) < 2:
        return 0
    return exponent * math.log2(abs(base))
