"""The sequenced operations (create_model, forward_backward, optim_step, the saves and loads, and the Skip that only
advances order), one module each, and the registry that every part of the server asks about them: the gate's body
caps, the OpenAPI document, the futures' JSON views, the Trainer's commands and replies, recovery (what a rebuild
replays, when to snapshot), mixing and worker deaths (which ones are forward passes), the fair share's costs, run
history, metrics and usage.

Adding an operation: a module here with its message (a frozen dataclass subclassing app.messages.SequencedOp) and
its `Operation` subclass declaring every member and trait (the registry refuses to load without them), its route in
app.api, and its test. An operation that needs a new capability of the ranks also adds a command to
app.messages.WorkerCommand (declaring `forward_pass`) and its case in app.ranks.execute (whose `match` is exhaustive:
mypy names a missing case). docs/architecture.md's recipe names every place.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from typing import Any

from app.messages import SequencedOp
from app.operations.base import CheckpointCommitter, HistoryStep, Operation, Reply, Traits

__all__ = [
    "OPERATIONS",
    "CheckpointCommitter",
    "HistoryStep",
    "Operation",
    "Reply",
    "Traits",
    "api_calls",
    "call_traits",
    "changes_model",
    "fair_share_cost",
    "operation",
]


def _discover() -> dict[type, Operation[Any, Any]]:
    """Every Operation subclass defined in this package's modules, by its message class."""
    found: dict[type, Operation[Any, Any]] = {}
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, Operation) and cls is not Operation and cls.__module__ == module.__name__:
                if cls.message in found:
                    raise TypeError(f"two operations run {cls.message.__name__}")
                found[cls.message] = cls()
    return found


def _traits_by_call(operations: dict[type, Operation[Any, Any]]) -> dict[str, Traits]:
    """Each API call's traits; operations that share a call must declare the same ones."""
    found: dict[str, Traits] = {}
    for op in operations.values():
        for call in op.calls:
            if found.setdefault(call, op.traits) != op.traits:
                raise TypeError(f"the operations answering {call} declare different traits")
    return found


OPERATIONS: dict[type, Operation[Any, Any]] = _discover()
_CALL_TRAITS = _traits_by_call(OPERATIONS)


def operation(op: SequencedOp) -> Operation[Any, Any]:
    """The Operation that runs `op`. Its reply takes the ranks' replies to its command once none is a CommandError,
    which are then of its type R."""
    return OPERATIONS[type(op)]


def changes_model(op: SequencedOp) -> bool:
    """Whether running `op` changes the model's weights, optimizer state or gradients (what a rebuild replays)."""
    return operation(op).changes_model(op)


def fair_share_cost(op: SequencedOp, fixed_cost: int) -> int:
    """What `op` costs in the fair share, in tokens."""
    return operation(op).cost(op, fixed_cost)


def api_calls() -> tuple[str, ...]:
    """The API calls answering with a future of a sequenced operation, in registry order."""
    return tuple(_CALL_TRAITS)


def call_traits() -> dict[str, Traits]:
    """Each API call answering with an operation's future -> its operation's traits: what the gate, the OpenAPI
    document and the futures' JSON views look a call (or a future's kind) up by."""
    return dict(_CALL_TRAITS)
