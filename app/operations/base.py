"""What every sequenced operation declares (`Operation`), and the reply it builds once every rank has answered."""

from __future__ import annotations

import asyncio
import json
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Generic, TypeVar

from app.db.checkpoints import CheckpointRecord, CheckpointStore
from app.db.futures import JSON_CONTENT_TYPE
from app.errors import UserError
from app.messages import ForwardBackwardArgs, OperationCommand, SequencedOp
from app.storage.objects import ObjectStorage

Op = TypeVar("Op", bound=SequencedOp)
R = TypeVar("R")  # what each rank answers the operation's command with, when it succeeds


@dataclass(frozen=True)
class Reply:
    """A future's result as stored: its bytes and their content type."""

    payload: bytes
    content_type: str
    metrics: dict[str, float] | None = None  # a training step's, for the run's history
    # a custom loss's estimated compute, in tokens of the base's training: what it costs in the fair share beyond the
    # tokens charged when it was sent
    cost_tokens: int = 0

    @classmethod
    def json(cls, body: dict[str, Any]) -> Reply:
        return cls(json.dumps(body).encode(), JSON_CONTENT_TYPE)


@dataclass(frozen=True)
class HistoryStep:
    """What a training step adds to its run's history (app.db.history): its input tokens, the learning rate it
    applied, and whether it finishes a step (an optim_step)."""

    tokens: int = 0
    learning_rate: float | None = None
    finishes_step: bool = False


class CheckpointCommitter:
    """Makes written checkpoints visible; the files a commit replaced, or its own if refused, are removed."""

    def __init__(self, checkpoints: CheckpointStore, storage: ObjectStorage) -> None:
        self._checkpoints = checkpoints
        self._storage = storage

    async def commit(self, record: CheckpointRecord, size_bytes: int, overwrite: bool) -> None:
        try:
            replaced = await self._checkpoints.commit(
                replace(record, size_bytes=size_bytes, created_at=time.time()), overwrite
            )
        except UserError:
            await asyncio.to_thread(self._storage.delete, record.location)
            raise
        if replaced is not None:
            await asyncio.to_thread(self._storage.delete, replaced)


JsonView = Callable[[bytes], dict[str, Any]]  # a protobuf result -> its JSON


@dataclass(frozen=True)
class Traits:
    """What the server's sites key on about an operation's calls and runs, each named with the site that applies it.
    Every field must be given: an operation cannot leave one to a default."""

    # its requests carry training data: its calls' bodies are capped by limits.max_request_bytes instead of the
    # control cap (app.api.gate)
    carries_batch: bool
    # its results are protobuf: the JSON sent instead to SDKs that do not accept protobuf (app.api.futures); None:
    # its results are JSON already
    json_view: JsonView | None
    # its routes decode their bodies themselves: that body's OpenAPI requestBody (app.api.openapi); None: the
    # route's pydantic model says it (and, if it requires a model_id, the link from create_model's)
    openapi_body: dict[str, Any] | None
    # False: it only advances its model's order (a Skip): nothing is sent to the workers, no outcome written
    # (app.trainer.service)
    runs: bool


# An operation without training data, JSON in and out, its body its route's model (all but forward_backward's).
CONTROL = Traits(carries_batch=False, json_view=None, openapi_body=None, runs=True)


class Operation(ABC, Generic[Op, R]):
    """One kind of sequenced operation, everything about it in one place: `message` the class the ingress sends
    (journaled as it is), `R` each rank's reply to its command. Every member is abstract: an operation that leaves
    one out cannot be instantiated, so the registry (app.operations) does not load."""

    message: ClassVar[type[SequencedOp]]
    # the API calls (POST /api/v1/<call>) answering with its future, each the `kind` of the futures it creates
    # (app.db.futures): what the calls' body caps, OpenAPI bodies and JSON views are looked up by
    calls: ClassVar[tuple[str, ...]]
    traits: ClassVar[Traits]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        missing = [name for name in ("message", "calls", "traits") if name not in cls.__dict__]
        if missing:
            raise TypeError(f"operation {cls.__name__} does not declare {missing}")

    @abstractmethod
    def name(self, op: Op) -> str:
        """The operation's name in logs, metrics and history (the API call's name)."""

    @abstractmethod
    def command(self, model_id: str, op: Op) -> OperationCommand:
        """What every rank runs (a forward pass's command declares it: app.messages.runs_a_pass)."""

    @abstractmethod
    def forward(self, op: Op) -> ForwardBackwardArgs | None:
        """The forward pass it runs over its batch (None: it runs none): what mixes with other models' passes
        (app.trainer.mixing), and what a death of the workers is blamed on and explained by
        (app.trainer.worker_deaths)."""

    @abstractmethod
    async def reply(self, model_id: str, op: Op, per_rank: list[R], committer: CheckpointCommitter) -> Reply:
        """The future's result, from each rank's successful answer."""

    @abstractmethod
    def changes_model(self, op: Op) -> bool:
        """Whether it changes the model's weights, optimizer state or gradients: what a rebuild replays (miss it and
        a rebuilt model silently diverges from the live one)."""

    @abstractmethod
    def counts_toward_snapshot(self, op: Op) -> bool:
        """Whether it counts toward the next snapshot (trainer.snapshot_every_steps); one is taken right after it."""

    @abstractmethod
    def cost(self, op: Op, fixed_cost: int) -> int:
        """What it costs its user in the fair share, in tokens (`fixed_cost`: trainer.fixed_op_cost_tokens)."""

    @abstractmethod
    def history(self, op: Op) -> HistoryStep | None:
        """What it adds to the run's history when it succeeds (None: nothing)."""

    @abstractmethod
    def trained_tokens(self, op: Op) -> int:
        """Tokens it trains on (the `trained` tokens metric)."""

    @abstractmethod
    def usage_tokens(self, op: Op) -> int:
        """Tokens its session's training usage counts (app.db.usage)."""
