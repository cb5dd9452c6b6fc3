"""The sequenced operations (forward_backward, optim_step, the saves and loads), one module each, and the registry
that every part of the server asks about them: routes' OpenAPI links, the Trainer's commands and replies, recovery
(what a rebuild replays, when to snapshot), the fair share's costs, run history, metrics and usage.

Adding an operation: a module here with its message (a frozen dataclass subclassing app.messages.SequencedOp) and
its `Operation` subclass declaring every member (the registry refuses to load without them), its route in app.api,
and its test. An operation that needs a new capability of the ranks also adds a command to app.messages.WorkerCommand
and its case in app.ranks.execute (whose `match` is exhaustive: mypy names a missing case).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from typing import Any

from app.messages import CreateModel, SequencedOp, Skip
from app.operations.base import CheckpointCommitter, HistoryStep, Operation, Reply

__all__ = [
    "OPERATIONS",
    "CheckpointCommitter",
    "HistoryStep",
    "Operation",
    "Reply",
    "api_calls",
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


OPERATIONS: dict[type, Operation[Any, Any]] = _discover()


def operation(op: SequencedOp) -> Operation[Any, Any]:
    """The Operation that runs `op` (never a Skip: those only advance order). Its reply takes the ranks' replies to
    its command once none is a CommandError, which are then of its type R."""
    return OPERATIONS[type(op)]


def changes_model(op: CreateModel | SequencedOp) -> bool:
    """Whether running `op` changes the model's weights, optimizer state or gradients (what a rebuild replays)."""
    if isinstance(op, CreateModel | Skip):
        return False
    return operation(op).changes_model(op)


def fair_share_cost(op: SequencedOp, fixed_cost: int) -> int:
    """What `op` costs in the fair share, in tokens; nothing to skip."""
    return 0 if isinstance(op, Skip) else operation(op).cost(op, fixed_cost)


def api_calls() -> tuple[str, ...]:
    """The API calls answering with a future of a sequenced operation, in registry order."""
    return tuple(dict.fromkeys(call for op in OPERATIONS.values() for call in op.calls))
