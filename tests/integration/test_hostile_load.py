"""Issue 45: while one user sends hostile requests concurrently, another user's healthz stays under 100 ms and their
training step completes, through the real Serve app.

`hostile_senders` lists one callable per kind of hostile request (each sends one, and checks it was refused as a
user error, or counts what was admitted); `under_hostile_load` runs them concurrently, several times each, while the
other user works: #1 bodies of millions of empty chunks, #2 operations with seq_ids counted down from a far one
against a pending quota of 3 (quotas.users in tests/integration/conftest.py), #4 session searches of thousands of
words.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import tinker
import zstandard
from tinker import types

from tests.integration.conftest import BASE_MODEL, QUOTAS
from tests.integration.helpers import future_result, new_client, raw_client
from tests.unit.protocol.test_count_bounds import _varint

HOSTILE_KEY = "tml-hostile-load"
COUNTDOWN_KEY = "tml-hostile-countdown"  # its pending quota is QUOTAS' (3)
SEARCH_WORDS = 5000  # on 6cc7317: 500 "Expression tree is too large", and seconds of the event loop
EMPTY_CHUNKS = 4_000_000  # a 16 MB body, ~1.6 KB as zstd: refused at limits.max_chunks_per_datum; on 6cc7317 its
# decode took ~8 s of CPU on the ingress event loop, each time
SENDS_PER_KIND = 4
PROBES = 10
HEALTHZ_LIMIT_S = 0.1


def _empty_chunks_body(model_id: str, seq_id: int) -> bytes:
    """#1: a forward_backward of one datum of EMPTY_CHUNKS empty encoded_text chunks, zstd-compressed."""
    from tinker.proto import tinker_public_pb2 as pb

    head = pb.ForwardBackwardRequest(model_id=model_id, seq_id=seq_id, loss_fn="cross_entropy").SerializeToString()
    datum = b"\x0a\x02\x0a\x00" * EMPTY_CHUNKS
    return zstandard.ZstdCompressor().compress(head + b"\x1a" + _varint(len(datum)) + datum)


def _new_model(base_url: str, key: str) -> str:
    with raw_client(base_url, key) as http:
        session = http.post("/api/v1/create_session", json={}).json()["session_id"]
        model = {"session_id": session, "model_seq_id": 0, "base_model": BASE_MODEL, "lora_config": {"rank": 4}}
        return future_result(http, http.post("/api/v1/create_model", json=model).json()["request_id"])["model_id"]


def hostile_senders(base_url: str) -> tuple[list[Callable[[], None]], Callable[[], None]]:
    """One sender per hostile request kind, set up as the hostile users: each call sends one request and asserts it
    was refused as a user error (a 4xx, or a future failed with one), never a 5xx; and the check, after the load, of
    what the senders that may be admitted (#2) counted."""
    model_id, countdown_model = _new_model(base_url, HOSTILE_KEY), _new_model(base_url, COUNTDOWN_KEY)
    bodies = [_empty_chunks_body(model_id, seq_id) for seq_id in range(1, SENDS_PER_KIND + 1)]  # made before the load
    far_seq_ids = itertools.count(1000, -1)
    lock = threading.Lock()
    countdown_answers: list[int] = []

    def empty_chunks() -> None:
        with lock:
            body = bodies.pop()
        headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": "zstd"}
        with raw_client(base_url, HOSTILE_KEY) as http:
            sent = http.post("/api/v1/forward_backward", content=body, headers=headers)
            assert sent.status_code == 200, sent.text
            error = future_result(http, sent.json()["request_id"])
        assert error.get("field") == "data[0].model_input.chunks", error
        assert "limits.max_chunks_per_datum" in error["error"], error

    def count_down() -> None:
        with lock:
            seq_id = next(far_seq_ids)
        step = {"model_id": countdown_model, "seq_id": seq_id, "adam_params": {"learning_rate": 1e-3}}
        with raw_client(base_url, COUNTDOWN_KEY) as http:
            sent = http.post("/api/v1/optim_step", json=step)
        assert sent.status_code in (200, 429), sent.text
        if sent.status_code == 429:
            assert "quotas.max_pending_requests_per_user" in sent.json()["error"], sent.text
        with lock:
            countdown_answers.append(sent.status_code)

    def search() -> None:
        words = " ".join(f"w{i}" for i in range(SEARCH_WORDS))
        with raw_client(base_url, HOSTILE_KEY) as http:
            answer = http.post("/api/v1/sessions/search", json={"display_name": words})
        assert answer.status_code == 400 and answer.json()["field"] == "display_name", answer.text

    def admitted_within_the_quota() -> None:
        assert sorted(countdown_answers).count(200) == QUOTAS["max_pending_requests_per_user"], countdown_answers

    return [empty_chunks, count_down, search], admitted_within_the_quota


def under_hostile_load(
    senders: list[Callable[[], None]], work: Callable[[], None], probe_url: str
) -> tuple[list[float], float, list[BaseException]]:
    """Run every sender SENDS_PER_KIND times concurrently with `work` (another user's), probing `probe_url` PROBES
    times spread over the load: the probes' latencies, the seconds the load took, and what the senders and the
    work raised."""
    latencies: list[float] = []
    started = time.monotonic()
    with ThreadPoolExecutor(len(senders) * SENDS_PER_KIND + 1) as pool:
        sent = [pool.submit(send) for send in senders for _ in range(SENDS_PER_KIND)]
        worked = pool.submit(work)
        with httpx.Client(timeout=60) as http:
            for _ in range(PROBES):
                time.sleep(0.2)  # the first after the senders' requests are under way
                before = time.monotonic()
                assert http.get(probe_url).status_code == 200
                latencies.append(time.monotonic() - before)
        raised = [error for future in [*sent, worked] if (error := future.exception()) is not None]
    return latencies, time.monotonic() - started, raised


def test_another_users_healthz_and_step_while_hostile_bodies_arrive(
    base_url: str, service_client: tinker.ServiceClient
) -> None:
    trainer = new_client(service_client, seed=45)
    data = [
        types.Datum(
            model_input=types.ModelInput.from_ints(list(range(3, 15))),
            loss_fn_inputs={"target_tokens": types.TensorData.from_numpy(np.arange(4, 16, dtype=np.int64))},
        )
    ]

    def step() -> None:
        trainer.forward_backward(data, "cross_entropy").result()
        trainer.optim_step(types.AdamParams(learning_rate=1e-3)).result()

    step()  # before the load too: the ingress's decoding processes are started by then
    senders, admitted_within_the_quota = hostile_senders(base_url)
    latencies, took, raised = under_hostile_load(senders, step, f"{base_url}/api/v1/healthz")
    print(f"\nhealthz under hostile load: max {max(latencies) * 1000:.0f} ms of {len(latencies)} probes, {took:.1f} s")
    assert max(latencies) < HEALTHZ_LIMIT_S, [round(x * 1000) for x in latencies]
    assert not raised, raised
    admitted_within_the_quota()
