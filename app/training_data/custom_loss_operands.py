"""What a custom loss's `operator.*` and `math.*` nodes may take, checked when the loss is created: tensors and
plain numbers only (a list, string or tuple times 10**8 would build it on every rank), at least one operand computed
by the loss (a node of constants only, `7 ** 10**9`, computes nothing from the data), math on numbers only (math
on a tensor leaves autograd), and no shape as an arithmetic operand (`x.shape * 10**8` is a tuple that long).

What each node gives is known here only as far as the graph says (`kind`): a shape, a number, a tensor, or unknown
(a tuple of tensors, say). The workers' interpreter checks every operand again as it runs
(app.training.custom_loss.host), and bounds what arithmetic on plain numbers computes.
"""

from __future__ import annotations

from typing import Any

from app.errors import UserError
from app.training_data.custom_loss_nodes import LossNode

TENSOR, SHAPE, NUMBER = "tensor", "shape", "number"
Kind = str | None  # None: unknown here

_ATTRIBUTES: dict[str, Kind] = {"shape": SHAPE, "ndim": NUMBER, "T": TENSOR, "mT": TENSOR}
_SIZES: dict[str, Kind] = {"dim": NUMBER, "numel": NUMBER}
# what may return a tuple of tensors (values and indices), by name as a function (torch.x) or a method
_TUPLES = frozenset({"sort", "topk", "max", "min", "median", "mode", "kthvalue", "aminmax"})


def arithmetic(target: str) -> bool:
    """Whether a call_function target is plain arithmetic: an operator other than indexing, or math."""
    return (target.startswith("operator.") and target != "operator.getitem") or target.startswith("math.")


def kind(node: LossNode, kinds: dict[str, Kind]) -> Kind:
    """What the node gives, from its op, target and the kinds of the nodes it reads."""
    if node.op == "placeholder":
        return TENSOR
    if node.op == "call_method":
        if node.target == "size":
            return SHAPE if len(node.args) == 1 else NUMBER
        return _SIZES.get(node.target, None if node.target in _TUPLES else TENSOR)
    if node.target == "getattr":
        return _ATTRIBUTES.get(node.args[1])
    if node.target == "operator.getitem":
        indexed = _kind_of(node.args[0], kinds)
        if indexed == SHAPE:
            return SHAPE if isinstance(node.args[1], dict) and "slice" in node.args[1] else NUMBER  # or one size
        return TENSOR if indexed == TENSOR else None
    if node.target.startswith("math."):
        return NUMBER
    if node.target.startswith("operator."):
        operands = [_kind_of(a, kinds) for a in node.args]
        if TENSOR in operands:
            return TENSOR
        return NUMBER if all(k == NUMBER for k in operands) else None
    return None if node.target.removeprefix("torch.") in _TUPLES else TENSOR


def check_operands(field: str, node: LossNode, kinds: dict[str, Kind]) -> None:
    """Refuse a call_function operator.* or math.* node whose operands are not what it may take."""
    where = f"{field} ({node.name!r}) {node.target}"
    if node.target == "operator.getitem":
        if not _is_ref(node.args[0]):
            raise UserError(f"{where} indexes a constant; a loss indexes what it computed", field=field)
        return
    operands = [*node.args, *node.kwargs.values()]
    for i, value in enumerate(operands):
        operand = _kind_of(value, kinds)
        if not _is_ref(value) and operand != NUMBER:
            raise UserError(
                f"{where} takes tensors and numbers; its operand {i} is {_described(value)}",
                field=field,
            )
        if operand == SHAPE:
            raise UserError(
                f"{where} takes tensors and numbers; its operand {i} is a shape (a sequence): use one size, x.shape[0]",
                field=field,
            )
        if operand == TENSOR and node.target.startswith("math."):
            raise UserError(f"{where} applies math to a tensor, which leaves autograd; use torch", field=field)
    if not any(_is_ref(value) for value in operands):
        raise UserError(f"{where} has only constant operands: it computes nothing from the loss's inputs", field=field)


def _kind_of(value: Any, kinds: dict[str, Kind]) -> Kind:
    """An encoded argument's kind: a node's (a ref), a number (a literal one, or inf and nan), else None."""
    if _is_ref(value):
        return kinds.get(value["ref"])
    if isinstance(value, bool | int | float) or (isinstance(value, dict) and value.keys() == {"float"}):
        return NUMBER
    return None


def _is_ref(value: Any) -> bool:
    return isinstance(value, dict) and value.keys() == {"ref"}


def _described(value: Any) -> str:
    if isinstance(value, dict) and len(value) == 1:
        return f"a {next(iter(value))}"  # the SDK's encoding: tuple, slice, dtype...
    if isinstance(value, str | list):
        return "a string" if isinstance(value, str) else "a list"
    return repr(value)
