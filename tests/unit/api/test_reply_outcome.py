"""The outcome in the reply (deployments/handles.py, app.db.outcomes): the Trainer writes a future's outcome to the
database and returns it; the ingress keeps it with its owner, so the first retrieve_future on that replica answers
without reading the future's row, exactly as the row would, and never to another user."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import numpy as np
from sqlalchemy import event
from sqlalchemy.engine import Engine

from app.db.futures import PROTO_CONTENT_TYPE, FutureStore
from app.db.outcomes import Written
from app.protocol.results import encode_forward_backward_output
from app.training_data.batch import ForwardBackwardResult
from deployments.handles import HandleCalls
from tests.unit.api.conftest import InProcessApi, saved_checkpoint

RESULT = encode_forward_backward_output(
    ForwardBackwardResult(np.array([0, 2]), {"logprobs": np.array([-0.25, -0.5], dtype=np.float32)}, {"loss:sum": 0.75})
)


@contextmanager
def statements() -> Iterator[list[str]]:
    """Every SQL statement any engine of this process sends while inside (one database round trip each), but the
    gate's read of the API key: these tests' Authenticator trusts no key it read before (cache_s 0), a served one
    reads it once per auth.key_cache_seconds."""
    sent: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "FROM api_keys" not in statement:
            sent.append(" ".join(statement.split()))

    event.listen(Engine, "before_cursor_execute", count)
    try:
        yield sent
    finally:
        event.remove(Engine, "before_cursor_execute", count)


def _trained_model(api: InProcessApi, user: str = "alice") -> str:
    """A model of `user`'s whose ownership this replica already checked, as the forward_backward route does."""
    model_id = saved_checkpoint(api, user).model_id
    api.run(api.services.training_run(model_id, api.user_id(user)))
    return model_id


class Trainer:
    """What deployments/trainer.py does with a submit, over its own FutureStore: write the outcome, then return
    it (`replies=False`: as before, return nothing)."""

    def __init__(self, api: InProcessApi, replies: bool = True) -> None:
        self.futures = FutureStore(api.services.futures._db)
        self.replies = replies

    async def submit(self, request_id: str, payload: bytes = RESULT) -> Written | None:
        await self.futures.complete(request_id, payload, PROTO_CONTENT_TYPE)
        return self.futures.recent.take(request_id) if self.replies else None

    async def cancelled(self, request_id: str) -> Written | None:  # its future failed first: nothing is written
        return await self.submit(request_id)


def _settle(api: InProcessApi, request_id: str, reply: Any, owner: str | None) -> None:
    """The ingress's HandleCalls tracks the trainer's call until it answers (its `_settle` keeps the reply)."""
    calls = HandleCalls("trainer", {}, api.services.futures)

    async def track() -> None:
        calls.track("t", request_id, reply, owner)
        await asyncio.gather(*list(calls._tasks))

    api.run(track())


def _forward_backward_round_trips(api: InProcessApi, replies: bool) -> tuple[dict[str, int], Any]:
    """Statements of one forward_backward's future: created by the ingress, completed by the trainer (its reply
    handed to the ingress), then the client's first retrieve_future on the same ingress replica; and its answer."""
    model_id, trainer, alice = _trained_model(api), Trainer(api, replies), api.user_id()
    api.post("/api/v1/retrieve_future", {"request_id": "warm-up"})  # the key's first use is not the future's
    with statements() as sent:
        request_id, _ = api.run(api.services.futures.create("forward_backward", model_id, 1))
        created = len(sent)
        _settle(api, request_id, lambda: trainer.submit(request_id), alice)
        completed = len(sent)
        answer = api.post("/api/v1/retrieve_future", {"request_id": request_id})
        counts = {"create": created, "complete": completed - created, "retrieve": len(sent) - completed}
    print(f"{'after' if replies else 'before'}: {counts}; statements: {sent}")
    return counts, answer


def test_the_first_retrieve_reads_no_row(api: InProcessApi) -> None:
    """Before (the reply carried nothing) the retrieve read the future's row; now it answers from the reply."""
    before, old = _forward_backward_round_trips(api, replies=False)
    after, new = _forward_backward_round_trips(api, replies=True)
    assert before == {"create": 2, "complete": 1, "retrieve": 1}  # INSERT future + session_request; UPDATE; SELECT
    assert after == {"create": 2, "complete": 1, "retrieve": 0}
    assert (new.status_code, new.headers["content-type"], new.content) == (
        old.status_code,
        old.headers["content-type"],
        old.content,
    )
    assert new.json()["metrics"] == {"loss:sum": 0.75}  # the JSON view for SDKs before protobuf results


def _reads_once_woken(api: InProcessApi, replies: bool) -> int:
    """Statements a retrieve_future that waits when the future finishes sends after it is woken."""
    model_id, trainer, alice = _trained_model(api), Trainer(api, replies), api.user_id()
    request_id, _ = api.run(api.services.futures.create("forward_backward", model_id, 1))
    answers: list[Any] = []
    with statements() as sent:
        poll = threading.Thread(
            target=lambda: answers.append(api.post("/api/v1/retrieve_future", {"request_id": request_id}))
        )
        poll.start()
        deadline = time.monotonic() + 10
        while not any(statement.startswith("SELECT futures.state") for statement in sent):
            assert time.monotonic() < deadline, sent
            time.sleep(0.01)  # its first read: pending
        before_completion = len(sent)
        _settle(api, request_id, lambda: trainer.submit(request_id), alice)
        poll.join()
        reads = len(sent) - before_completion - 1  # less the trainer's UPDATE
    assert answers[0].json()["metrics"] == {"loss:sum": 0.75}
    return reads


def test_a_waiting_long_poll_reads_no_row_once_woken(api: InProcessApi) -> None:
    """The usual order: the SDK's retrieve_future already waits when the future finishes. Its first read finds
    the future pending; woken, it read the row again before, and answers from the reply now."""
    api.services.futures = FutureStore(api.services.futures._db, poll_interval_s=100.0)  # no timed re-read here
    woken = {"before": _reads_once_woken(api, replies=False), "after": _reads_once_woken(api, replies=True)}
    print(f"reads of the woken long-poll: {woken}")
    assert woken == {"before": 1, "after": 0}


def test_retrieve_answers_as_the_row_does(api: InProcessApi) -> None:
    """Protobuf for SDKs that ask for it, a failure's body, and the next poll (from the row) the same again."""
    model_id, trainer, alice = _trained_model(api), Trainer(api), api.user_id()
    request_id, _ = api.run(api.services.futures.create("forward_backward", model_id, 1))
    _settle(api, request_id, lambda: trainer.submit(request_id), alice)
    proto = {"Accept": PROTO_CONTENT_TYPE}
    kept = api.post("/api/v1/retrieve_future", {"request_id": request_id}, headers=proto)
    read = api.post("/api/v1/retrieve_future", {"request_id": request_id}, headers=proto)
    assert kept.content == read.content == RESULT
    assert kept.headers["content-type"] == read.headers["content-type"] == PROTO_CONTENT_TYPE

    failing, _ = api.run(api.services.futures.create("optim_step", model_id, 2))
    error = {"error": "out of memory", "category": "server"}

    async def fail() -> Written | None:
        await trainer.futures.fail(failing, error)
        return trainer.futures.recent.take(failing)

    _settle(api, failing, fail, alice)
    assert api.services.futures.recent.owned_by(failing, alice)
    kept_failure = api.post("/api/v1/retrieve_future", {"request_id": failing})
    assert (kept_failure.status_code, kept_failure.json()) == (200, error)
    assert api.post("/api/v1/retrieve_future", {"request_id": failing}).json() == error


def test_another_user_gets_exactly_the_answer_of_a_missing_future(api: InProcessApi) -> None:
    model_id, trainer, alice = _trained_model(api), Trainer(api), api.user_id()
    request_id, _ = api.run(api.services.futures.create("forward_backward", model_id, 1))
    _settle(api, request_id, lambda: trainer.submit(request_id), alice)
    api.post("/api/v1/retrieve_future", {"request_id": "warm-up"}, user="bob")
    with statements() as sent:
        bobs = api.post("/api/v1/retrieve_future", {"request_id": request_id}, user="bob")
    missing = api.post("/api/v1/retrieve_future", {"request_id": "0" * 32}, user="bob")
    assert bobs.status_code == missing.status_code == 404
    assert bobs.json() == {**missing.json(), "error": missing.json()["error"].replace("0" * 32, request_id)}
    assert sent == []  # bob's was checked as before (the future's session and its owner are cached here)
    assert api.services.futures.recent.owned_by(request_id, alice)  # and took nothing: alice's answer is still here
    assert api.post("/api/v1/retrieve_future", {"request_id": request_id}).json()["metrics"] == {"loss:sum": 0.75}


def test_a_cancel_is_never_shadowed(api: InProcessApi) -> None:
    """Cancelled first, the trainer's later write changes nothing and its reply carries nothing: retrieve says
    cancelled. Finished first, a cancel changes nothing: retrieve answers the result, from memory or the row."""
    model_id, trainer, alice = _trained_model(api), Trainer(api), api.user_id()
    cancels: list[tuple] = []

    async def cancel(*args: Any) -> None:
        cancels.append(args)

    api.services.trainers = SimpleNamespace(cancel=cancel)  # type: ignore[assignment]
    first, _ = api.run(api.services.futures.create("forward_backward", model_id, 1))
    assert api.post("/api/v1/cancel_future", {"request_id": first}).json() == {}
    assert len(cancels) == 1
    reply: list[Written | None] = []

    async def late() -> Written | None:
        reply.append(await trainer.cancelled(first))
        return reply[-1]

    _settle(api, first, late, alice)
    assert reply == [None]
    for _ in range(2):  # the cancel's failure as this replica wrote it, then from the row
        answer = api.post("/api/v1/retrieve_future", {"request_id": first}).json()
        assert answer["category"] == "user" and answer["cancelled"] is True

    second, _ = api.run(api.services.futures.create("forward_backward", model_id, 2))
    _settle(api, second, lambda: trainer.submit(second), alice)
    assert api.post("/api/v1/cancel_future", {"request_id": second}).json() == {}  # finished already
    assert len(cancels) == 1
    for _ in range(2):
        assert api.post("/api/v1/retrieve_future", {"request_id": second}).json()["metrics"] == {"loss:sum": 0.75}
