"""Failure injection (runs last: it restarts the shared worker group, the ingress, then the whole app), on the app of
the `sharded_app` fixture: the base sharded across the two workers (fsdp), its activations recomputed.

A training worker is killed mid-run: the trainer rebuilds its models from their snapshots and journals and
resends what was in flight, so the run finishes as if nothing happened. The ingress replica is killed: work
already queued finishes and its futures are answered by the new replica. The sampler replica is killed under
load: the ingress sends its samples again, the replacement replica answers them all and loads adapters on
demand. The Serve app is stopped and started again on the same state mid-run: the model comes back by id, its
step in flight completes, and runs, checkpoints and finished futures survive."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import ray
import tinker
from ray import serve
from ray.util.state import list_actors
from tinker import types

from app.allocator import TCMALLOC
from app.db import journal_codec
from app.messages import AdamParams
from app.operations.optim_step import OptimStep
from tests import processes
from tests.integration.conftest import BASE_MODEL, MAX_PENDING_SAMPLES, MAX_TOKENS, replace_app, sharded_config
from tests.integration.helpers import (
    logprobs_of,
    new_client,
    packed,
    random_datums,
    reference_run,
    sft_datums,
    train_steps,
    trainer_logprobs,
)

pytestmark = pytest.mark.usefixtures("sharded_app")

RESTART_BUDGET_S = 180.0  # Ray Train detects the death, restarts both ranks, reloads the base model
ADAM = tinker.types.AdamParams(learning_rate=1e-2)
IN_ORDER_ATOL = 1e-2  # 2 sharded ranks vs one process: 1e-3 measured after 10 steps at lr 1e-2
SAMPLER_ATOL = 2e-4  # as in test_sampling: vLLM and the trainer agree to ~1e-5 in fp32
SAMPLE_HAND_OFF_S = 1.0  # created sample futures to the Sampler holding them: milliseconds when idle


def _pipelined_run(tc: tinker.TrainingClient, data: list, steps: int, after: int = -1, then=None) -> list[np.ndarray]:
    """`steps` forward_backward + optim_step pairs sent at once (as the cookbook pipelines them); `then()` runs once
    step `after` finished. Every result is awaited (any error raises); returns the trained model's logprobs."""
    sent = []
    for _ in range(steps):
        sent.append(tc.forward_backward(data, "cross_entropy"))
        sent.append(tc.optim_step(ADAM))
    for i, future in enumerate(sent):
        future.result()
        if i == 2 * after + 1 and then is not None:
            then()
    return logprobs_of(tc.forward(data, "cross_entropy").result())


def _replica(deployment: str) -> dict:
    """The named actor of the deployment's only replica."""
    (replica,) = [a for a in ray.util.list_named_actors(all_namespaces=True) if f"#{deployment}#" in a["name"]]
    return replica


@pytest.fixture(scope="module")
def worker_pids() -> Iterator[Callable[[], list[int]]]:
    """Asks the trainer for its worker pids through a Serve handle. Serve's routers run on their caller's event loop
    here (deployments/serve_env.py), so the handle lives on a loop of its own, in a thread, for the whole module."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def ask() -> list[int]:
        return await serve.get_deployment_handle(f"Trainer:{BASE_MODEL}", app_name="tinker").worker_pids.remote()

    yield lambda: asyncio.run_coroutine_threadsafe(ask(), loop).result(timeout=60)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=10)


def _engine_cores(replica: dict) -> list[int]:
    """The vLLM engine core processes the replica's process started."""
    (actor,) = list_actors(filters=[("name", "=", replica["name"]), ("state", "=", "ALIVE")])
    return [p for p in processes.pids() if processes.parent(p) == actor.pid and b"EngineCore" in processes.cmdline(p)]


def _maps_tcmalloc(pid: int) -> bool:
    """Whether the process has tcmalloc loaded."""
    return TCMALLOC.name in Path(f"/proc/{pid}/maps").read_text()


def _kill(replica: dict) -> None:
    ray.kill(ray.get_actor(replica["name"], namespace=replica["namespace"]), no_restart=True)


def test_a_killed_worker_loses_no_model_and_no_request(sharded_client, worker_pids, reference_base):
    """SIGKILL a training worker in the middle of a pipelined 10-step run: the run finishes without a client error
    and its weights equal those of the same run undisturbed (the model is rebuilt from its snapshot, taken every 3
    steps here, and the journal since; in-flight requests are resent). The undisturbed run is the same 10 steps in
    this process, one after another, to float32 rounding (steps run out of order differ by nats)."""
    data = sft_datums(new_client(sharded_client, seed=40).get_tokenizer())
    undisturbed = _pipelined_run(new_client(sharded_client, seed=41), data, 10)
    in_order = reference_run(reference_base, seed=41, rank=8, batch=packed(data), steps=10, lr=ADAM.learning_rate)
    np.testing.assert_allclose(np.concatenate(undisturbed), in_order, atol=IN_ORDER_ATOL)

    pids = worker_pids()
    assert len(pids) == 2 and all(isinstance(p, int) for p in pids)
    assert [_maps_tcmalloc(p) for p in pids] == [TCMALLOC.exists()] * 2  # CPU ranks preload it where installed
    started: list[float] = []

    def kill() -> None:
        started.append(time.monotonic())
        os.kill(pids[1], signal.SIGKILL)

    recovered = _pipelined_run(new_client(sharded_client, seed=41), data, 10, after=4, then=kill)
    assert started and time.monotonic() - started[0] < RESTART_BUDGET_S
    print(f"worker killed -> the run's last step answered in {time.monotonic() - started[0]:.1f} s")  # pytest -s
    assert pids[1] not in worker_pids()
    assert [_maps_tcmalloc(p) for p in worker_pids()] == [TCMALLOC.exists()] * 2  # the new rank too
    for got, want in zip(recovered, undisturbed, strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_killed_trainer_replica_loses_no_model_and_no_request(sharded_client):
    """Kill the Trainer replica (the actor that owns the worker group) mid-run: Serve starts another, which rebuilds
    the models from their snapshots and journals and reruns what was queued; the client sees no error and the
    weights equal an undisturbed run's."""
    data = sft_datums(new_client(sharded_client, seed=46).get_tokenizer())
    undisturbed = _pipelined_run(new_client(sharded_client, seed=47), data, 6)

    def kill() -> None:
        started.append(time.monotonic())
        _kill(_replica(f"Trainer:{BASE_MODEL}"))

    started: list[float] = []
    recovered = _pipelined_run(new_client(sharded_client, seed=47), data, 6, after=3, then=kill)
    print(f"trainer replica killed -> the run's last step answered in {time.monotonic() - started[0]:.1f} s")
    for got, want in zip(recovered, undisturbed, strict=True):
        np.testing.assert_array_equal(got, want)


def _mailbox() -> ray.actor.ActorHandle:
    """The mailbox actor of the policy trainer's worker group (app.trainer.worker_group names it)."""
    (mailbox,) = [
        a
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith("mailbox-") and a["name"].endswith(f":{BASE_MODEL}")
    ]
    return ray.get_actor(mailbox["name"], namespace=mailbox["namespace"])


def _until(condition: Callable[[], bool], failure: str, budget_s: float = RESTART_BUDGET_S) -> None:
    deadline = time.monotonic() + budget_s
    while not condition():
        assert time.monotonic() < deadline, failure
        time.sleep(0.05)


def _kill_while_it_runs(mailbox: ray.actor.ActorHandle, request_id: str) -> None:
    """SIGKILL every rank of the worker group once one has taken the operation `request_id`; returns once the group
    restarted (its mailbox no longer says what the dead ranks were running)."""
    restarts = ray.get(mailbox.status.remote())["restarts"]
    _until(lambda: request_id in ray.get(mailbox.running.remote()), "the operation never ran")
    for identity in ray.get(mailbox.identities.remote()).values():
        os.kill(int(identity.split("-")[0]), signal.SIGKILL)
    _until(lambda: ray.get(mailbox.status.remote())["restarts"] > restarts, "the workers never restarted")


def test_an_operation_that_kills_the_workers_fails_and_the_rest_goes_on(
    base_url, sharded_client, sharded_state_dir: Path
):
    """Both training workers are SIGKILLed each time one forward_backward runs (as Ray's memory monitor kills the
    workers of a step too large for them): after the second death it fails with a user error that names it and what
    to change, instead of being resent forever. Its model's next steps succeed, without gradients from it (equal to
    a twin that never sent it), and another model, training throughout, ends equal to an undisturbed twin.

    Runs after the Trainer replica kill: Ray Train restarts a worker group twice per replica (max_failures)."""
    other, other_twin = new_client(sharded_client, seed=49), new_client(sharded_client, seed=49)
    data = sft_datums(other.get_tokenizer())
    train_steps(other_twin, data, 3)
    expected_other = logprobs_of(other_twin.forward(data, "cross_entropy").result())
    train_steps(other, data, 1)
    big_twin = new_client(sharded_client, seed=50)
    train_steps(big_twin, data, 1)
    expected_big = logprobs_of(big_twin.forward(data, "cross_entropy").result())

    own = tinker.ServiceClient(base_url=base_url, api_key="tml-integration-tests")
    big = new_client(own, seed=50)
    # this client sends the whole batch as one request, one operation (as a client ignoring the advertised chunk
    # length would): a single operation that runs for seconds
    big.holder._client_config = big.holder._client_config.model_copy(update={"fwdbwd_max_chunk_len": 1024})
    mailbox = _mailbox()
    started = time.monotonic()
    doomed = big.forward_backward(random_datums(96, MAX_TOKENS, seed=0), "cross_entropy")
    in_flight = [other.forward_backward(data, "cross_entropy"), other.optim_step(ADAM)]  # queued behind it
    _wait_for_futures(sharded_state_dir, [big.model_id], 1, "the forward_backward never reached the server")
    with sqlite3.connect(sharded_state_dir / "tinker_serve.db") as db:
        query = "SELECT request_id FROM futures WHERE subject_id = ? AND state = 'pending'"
        (request_id,) = db.execute(query, (big.model_id,)).fetchone()
    for _ in range(2):
        _kill_while_it_runs(mailbox, request_id)

    with pytest.raises(tinker.RequestFailedError) as failed:
        doomed.result(timeout=RESTART_BUDGET_S)
    print(f"\nkilled twice -> failed {time.monotonic() - started:.1f} s after it was sent: {failed.value.message}")
    assert failed.value.category == "user"
    assert (
        "forward_backward of 24576 tokens (its largest pass on a rank: 128 tokens, padding included) was running when "
        "the training workers died twice (killed for memory, most likely); it was not run again and the model has no "
        "gradients from it. That pass needs about 8 MiB of activations. To fit: send shorter datums; raise "
        "trainer.num_workers (now 2): a datum of more than 12 tokens is split across all of them, ceil(256 / "
        "num_workers) tokens a rank (now 128); set trainer.dtype: bfloat16 (half the memory); or give each worker "
        "more memory" in failed.value.message  # the SDK's message wraps the server's (its datums are split: 2 x 128)
    )
    with sqlite3.connect(sharded_state_dir / "tinker_serve.db") as db:
        assert db.execute("SELECT worker_deaths FROM journal WHERE request_id = ?", (request_id,)).fetchone() == (2,)

    train_steps(big, data, 1)  # the model goes on, with no gradients from the operation given up
    assert all(f.result() is not None for f in in_flight)  # the other model's step, resent after each rebuild
    train_steps(other, data, 1)
    for client, expected in ((big, expected_big), (other, expected_other)):
        for got, want in zip(logprobs_of(client.forward(data, "cross_entropy").result()), expected, strict=True):
            np.testing.assert_array_equal(got, want)
    own.close("success").result()


def _retrieve(http: httpx.Client, request_id: str) -> dict:
    return http.post("/api/v1/retrieve_future", json={"request_id": request_id}).json()


def _count_futures(sharded_state_dir: Path, model_ids: list[str], state: str | None = "pending") -> int:
    """The futures of these models in `state` (None: in any state)."""
    with sqlite3.connect(sharded_state_dir / "tinker_serve.db") as db:
        marks = ",".join("?" * len(model_ids))
        in_state = "" if state is None else "state = ? AND "
        query = f"SELECT count(*) FROM futures WHERE {in_state}subject_id IN ({marks})"
        return db.execute(query, ([] if state is None else [state]) + model_ids).fetchone()[0]


def _wait_for_futures(
    sharded_state_dir: Path,
    model_ids: list[str],
    count: int,
    failure: str,
    state: str | None = "pending",
    still: Callable[[], bool] = lambda: True,
) -> None:
    """Until `count` futures of these models are in `state`: within 30 s, and while `still()` holds."""
    deadline = time.monotonic() + 30
    while _count_futures(sharded_state_dir, model_ids, state) < count:
        assert time.monotonic() < deadline and still(), failure
        time.sleep(0.05)


def _sample_in_flight(
    sharded_state_dir: Path, samplers: list[tinker.SamplingClient], count: int, tokens: int = 160
) -> list:
    """`count` samples of `tokens` tokens from `samplers` in turn, returned once every one is sent (its future
    pending)."""
    prompt = types.ModelInput.from_ints(samplers[0].get_tokenizer().encode("What is 12 + 7? The answer"))
    params = types.SamplingParams(max_tokens=tokens, temperature=1.0)
    samples = [samplers[i % len(samplers)].sample(prompt, 1, params).future() for i in range(count)]
    sessions = [s._sampling_session_id for s in samplers]

    def none_finished() -> bool:
        return not any(f.done() for f in samples)

    _wait_for_futures(
        sharded_state_dir, sessions, count, "the samples were not all pending together", still=none_finished
    )
    return samples


def test_ingress_restart_loses_nothing(sharded_client, sharded_state_dir: Path):
    """Only the HTTP front dies: work queued on the trainer and the sampler finishes and every future is still
    answered."""
    tc = new_client(sharded_client, seed=45)
    data = sft_datums(tc.get_tokenizer())
    before = tc.forward_backward(data, "cross_entropy").result().metrics["loss:sum"]
    sampler = sharded_client.create_sampling_client(base_model=BASE_MODEL).result()
    samples = _sample_in_flight(sharded_state_dir, [sampler], 4, tokens=800)
    # The ingress hands each sample to the Sampler just after creating its future; a hand-off still under way when
    # the ingress dies is lost (the future fails after timeouts.sample_timeout_seconds). This test is about work the
    # Sampler already has: give the hand-offs time to land on a loaded machine (the samples run for seconds).
    time.sleep(SAMPLE_HAND_OFF_S)
    in_flight = [tc.optim_step(ADAM), tc.forward(data, "cross_entropy")]
    replica = _replica("Ingress")
    _kill(replica)
    started = time.monotonic()
    assert not any(f.done() for f in samples), "samples finished before the kill: make them longer"
    after = in_flight[1].result().metrics["loss:sum"]  # the SDK retries until the new ingress answers
    assert after < before and in_flight[0].result() is not None
    assert all(f.result(timeout=120).sequences[0].tokens for f in samples)
    assert time.monotonic() - started < 120
    assert _replica("Ingress")["name"] != replica["name"]
    assert sharded_client.create_rest_client().get_training_run(tc.model_id).result().training_run_id == tc.model_id


def _future_left_by_a_dead_ingress(sharded_state_dir: Path, kind: str, model_id: str, seq_id: int) -> str:
    """The state an Ingress replica leaves when it is killed just after creating an operation's future, before the
    journal and the trainer had the operation: a pending future, nothing else (the SDK then retries its request).
    Returns its request id."""
    request_id, now = os.urandom(16).hex(), time.time()
    with sqlite3.connect(sharded_state_dir / "tinker_serve.db", timeout=30) as db:
        db.execute(
            "INSERT INTO futures (request_id, kind, subject_id, seq_id, state, created_at) VALUES (?, ?, ?, ?, ?, ?)",
            (request_id, kind, model_id, seq_id, "pending", now),
        )
        db.execute(
            "INSERT INTO session_requests (request_id, session_id, created_at) VALUES (?, ?, ?)",
            (request_id, model_id.split(":")[0], now),
        )
    return request_id


def test_a_retry_hands_over_what_a_dead_ingress_only_promised(sharded_client, sharded_state_dir: Path):
    """An ingress killed between creating a future and handing its operation to the trainer: the SDK's retry finds
    the pending future and the new attempt hands the operation over, so the model neither stalls on a gap nor
    skips the step (a create_model cut the same way is created)."""
    holder = sharded_client.holder
    next_model = f"{holder.get_session_id()}:train:{holder._training_client_counter}"
    _future_left_by_a_dead_ingress(sharded_state_dir, "create_model", next_model, 0)
    # the SDK's create_model request meets that pending future
    tc = sharded_client.create_lora_training_client(base_model=BASE_MODEL, rank=8, seed=49).result(timeout=60)
    data = sft_datums(tc.get_tokenizer())
    before = tc.forward_backward(data, "cross_entropy").result(timeout=60).metrics["loss:sum"]
    _future_left_by_a_dead_ingress(sharded_state_dir, "optim_step", tc.model_id, tc._request_id_counter + 1)
    assert tc.optim_step(ADAM).result(timeout=60) is not None
    assert tc.forward(data, "cross_entropy").result(timeout=60).metrics["loss:sum"] < before


def test_an_operation_answered_but_never_handed_over_still_runs(sharded_client, sharded_state_dir: Path):
    """An ingress killed after answering an operation (its future and journal entry written) and before its hand-over
    to the trainer left: the client only polls, so nothing retries it. An ingress replica's hand-over check finds
    it pending, asks the trainer, and hands it over: it runs within two timeouts.handover_check_seconds (3 s in the
    suite, 10 s by default)."""
    tc = new_client(sharded_client, seed=50)
    tc.forward_backward(sft_datums(tc.get_tokenizer()), "cross_entropy").result(timeout=60)
    seq_id = tc._request_id_counter + 1
    request_id = _future_left_by_a_dead_ingress(sharded_state_dir, "optim_step", tc.model_id, seq_id)
    step = journal_codec.encode(OptimStep(request_id, AdamParams(learning_rate=ADAM.learning_rate)))
    with sqlite3.connect(sharded_state_dir / "tinker_serve.db", timeout=30) as db:
        db.execute(
            "INSERT INTO journal (model_id, seq_id, request_id, op, created_at) VALUES (?, ?, ?, ?, ?)",
            (tc.model_id, seq_id, request_id, step, time.time()),
        )
    deadline = time.monotonic() + 60
    while (state := _future_state(sharded_state_dir, request_id)) == "pending":
        assert time.monotonic() < deadline, "the operation was never handed over"
        time.sleep(0.1)
    assert state == "completed"


def _future_state(sharded_state_dir: Path, request_id: str) -> str:
    with sqlite3.connect(sharded_state_dir / "tinker_serve.db", timeout=30) as db:
        return str(db.execute("SELECT state FROM futures WHERE request_id = ?", (request_id,)).fetchone()[0])


def test_sampler_replica_death_is_invisible_to_clients(sharded_client, sharded_state_dir: Path):
    """16 samples (half from a LoRA adapter) in flight when the only Sampler replica dies: the ingress sends
    them again, the replacement replica answers every one (loading the adapter on demand), nothing stays
    pending, and a sample of the adapter afterwards carries its weights."""
    tc = new_client(sharded_client, seed=48)
    train_steps(tc, sft_datums(tc.get_tokenizer()), 2, lr=3e-3)
    path = tc.save_weights_for_sampler("before-sampler-kill").result().path
    adapter = sharded_client.create_sampling_client(model_path=path).result()
    base = sharded_client.create_sampling_client(base_model=BASE_MODEL).result()
    prompt = types.ModelInput.from_ints(tc.get_tokenizer().encode("What is 12 + 7? The answer"))
    adapter.sample(prompt, 1, types.SamplingParams(max_tokens=4)).result()  # the doomed replica loads it
    victim = _replica(f"Sampler:{BASE_MODEL}")
    engine_cores = _engine_cores(victim)
    assert len(engine_cores) == 1, engine_cores

    in_flight = _sample_in_flight(sharded_state_dir, [adapter, base], MAX_PENDING_SAMPLES)
    _kill(victim)
    killed = time.monotonic()
    assert not any(f.done() for f in in_flight), "samples finished before the kill: make them longer"
    while processes.alive(engine_cores[0]) and time.monotonic() - killed < 15:  # the orphaned engine core kills itself
        time.sleep(0.2)
    assert not processes.alive(engine_cores[0]), "the killed replica's vLLM engine core outlived it"

    results = [f.result(timeout=RESTART_BUDGET_S) for f in in_flight]  # no client error
    print(f"\n{len(results)} samples answered {time.monotonic() - killed:.1f} s after the sampler replica died")
    assert all(len(r.sequences) == 1 and r.sequences[0].tokens for r in results)
    assert _count_futures(sharded_state_dir, [adapter._sampling_session_id, base._sampling_session_id]) == 0
    assert _replica(f"Sampler:{BASE_MODEL}")["name"] != victim["name"]

    after = adapter.sample(prompt, 1, types.SamplingParams(max_tokens=12, temperature=1.0)).result().sequences[0]
    expected = trainer_logprobs(tc, prompt.to_ints() + after.tokens)[-len(after.tokens) :]
    np.testing.assert_allclose(after.logprobs, expected, atol=SAMPLER_ATOL)  # the adapter, not the base model


def test_an_app_restart_mid_run_resumes_the_model(
    sharded_client, base_url: str, sharded_state_dir: Path, object_store: str
):
    """The Serve app stops and starts again on the same state while a step is in flight: the client goes on with
    the same model by id, the step in flight completes, and the weights equal an undisturbed run's; finished
    futures, runs and checkpoints survive. A model created while the new trainer starts is created and trains."""
    twin, tc = new_client(sharded_client, seed=43), new_client(sharded_client, seed=43)
    data = sft_datums(tc.get_tokenizer())
    for client in (twin, tc):
        train_steps(client, data, 4)  # past a snapshot (every 3 steps here): rebuilt from it and the journal
    train_steps(twin, data, 2)
    expected = logprobs_of(twin.forward(data, "cross_entropy").result())
    saved = tc.save_state("before-restart").result().path
    with httpx.Client(base_url=base_url, timeout=60, headers={"X-API-Key": "tml-integration-tests"}) as http:
        finished = http.post("/api/v1/unload_model", json={"model_id": new_client(sharded_client, seed=44).model_id})
        finished_result = _retrieve(http, finished.json()["request_id"])
        # In flight across the restart. The SDK's own polls of these find no server while no app is deployed
        # (direct ingress: the port is closed until the new Ingress replica opens it), so they are not awaited: the
        # steps after them can only run, and the weights only match, if the server finished them exactly once.
        accepted = _count_futures(sharded_state_dir, [tc.model_id], state=None)
        tc.forward_backward(data, "cross_entropy")
        tc.optim_step(ADAM)
        # both accepted (journaled) before the app goes: the SDK sends them from its own thread, later
        _wait_for_futures(
            sharded_state_dir,
            [tc.model_id],
            accepted + 2,
            "the two steps in flight never reached the server",
            state=None,
        )

        started = time.monotonic()
        created: list[tuple[str, tinker.TrainingClient]] = []

        def create_while_the_trainer_starts() -> None:
            trainer = serve.status().applications["tinker"].deployments[f"Trainer:{BASE_MODEL}"].status
            created.append((trainer, new_client(sharded_client, seed=45)))  # returns once the model is created

        replace_app(
            sharded_config(sharded_state_dir, object_store), base_url, while_starting=create_while_the_trainer_starts
        )

        assert _retrieve(http, finished.json()["request_id"]) == finished_result
        assert http.get(f"/api/v1/training_runs/{tc.model_id}").json()["last_snapshot_time"] is not None
    train_steps(tc, data, 1)
    ((trainer_then, fresh),) = created
    assert trainer_then != "HEALTHY", "the model was meant to be created while its trainer started"
    assert fresh.forward_backward(data, "cross_entropy").result().metrics["loss:sum"] > 0
    print(f"app restarted -> the next step answered {time.monotonic() - started:.1f} s after the restart began")
    for got, want in zip(logprobs_of(tc.forward(data, "cross_entropy").result()), expected, strict=True):
        np.testing.assert_array_equal(got, want)
    rest = sharded_client.create_rest_client()
    assert rest.get_training_run(tc.model_id).result().base_model == BASE_MODEL
    checkpoints = rest.list_checkpoints(tc.model_id).result().checkpoints
    assert "weights/before-restart" in {c.checkpoint_id for c in checkpoints}
    restored = sharded_client.create_training_client_from_state_with_optimizer(saved).result()
    assert restored.forward(data, "cross_entropy").result().metrics["loss:sum"] > 0
