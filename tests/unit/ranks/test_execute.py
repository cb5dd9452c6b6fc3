"""How a rank runs what the mailbox hands it (app.ranks.execute), without Ray and without a model: an unknown object
is an error reply, never a success; a large forward_backward travels through the object store (here a dict in place
of Ray's) and runs as the command the Trainer sent."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from app.link import shipping
from app.link.shipping import INLINE_BATCH_BYTES, StoredForwardBackward, ship
from app.messages import (
    CommandError,
    ForwardBackwardArgs,
    ForwardBackwardCommand,
    PingCommand,
    RemoveModelCommand,
    ShardOutput,
)
from app.ranks.execute import execute
from app.ranks.snapshots import SnapshotWriter
from app.storage.objects import ObjectStorage
from app.training_data.batch import PackedBatch


class _Engine:
    """The parts of a TrainingEngine these commands reach."""

    rank = 0
    sharded = False

    def __init__(self) -> None:
        self.ran: list[tuple[Any, ...]] = []

    def forward_backward(self, *args: Any) -> ShardOutput:
        self.ran.append(args)
        return ShardOutput(np.array([0]), np.array([0, 1]), {}, 0.5)

    def remove_model(self, model_id: str) -> None:
        self.ran.append(("remove", model_id))


def _run(cmd: Any, tmp_path: Path, engine: _Engine | None = None) -> Any:
    storage = ObjectStorage(str(tmp_path))
    return execute(engine or _Engine(), storage, SnapshotWriter(storage), cmd)  # the stand-in engine


def test_an_unknown_command_is_an_error_reply_not_a_success(tmp_path: Path) -> None:
    class Unknown:  # e.g. a command a newer trainer sends, or an object sent by mistake
        request_id = "r"

    reply = _run(Unknown(), tmp_path)
    assert isinstance(reply, CommandError)
    assert reply.error["category"] == "server" and reply.error["error"].startswith("Unknown failed on a worker: ")
    assert isinstance(_run(SimpleNamespace(name="ping"), tmp_path), CommandError)  # named, but no command either


def test_known_commands_still_answer(tmp_path: Path) -> None:
    engine = _Engine()
    assert _run(PingCommand(), tmp_path) == os.getpid()
    assert _run(RemoveModelCommand("m"), tmp_path, engine) is None and engine.ran == [("remove", "m")]


def _forward(tokens: int) -> ForwardBackwardCommand:
    batch = PackedBatch(np.zeros(tokens, np.int64), np.array([0, tokens], np.int64))
    return ForwardBackwardCommand("m", ForwardBackwardArgs("cross_entropy", {}, True, batch), request_id="r1")


def test_a_large_batch_travels_through_the_object_store_and_runs_as_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store: dict[int, Any] = {}

    def put(value: Any) -> int:
        store[len(store)] = value
        return len(store) - 1

    monkeypatch.setattr(shipping.ray, "put", put)
    monkeypatch.setattr(shipping.ray, "get", store.__getitem__)
    small = _forward(8)
    assert ship(small) is small and store == {}  # inside the message
    large = _forward(INLINE_BATCH_BYTES // 8 + 1)
    shipped = ship(large)
    assert isinstance(shipped, StoredForwardBackward) and list(store.values()) == [large]
    assert (shipped.model_id, shipped.request_id) == ("m", "r1")  # what the mailbox reads of it
    engine = _Engine()
    assert isinstance(_run(shipped, tmp_path, engine), ShardOutput)
    (args,) = engine.ran
    assert args[0] == "m" and args[3] is large.args.batch
