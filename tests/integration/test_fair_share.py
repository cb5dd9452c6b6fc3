"""Fair share on a shared trainer, through the real SDK: two API keys (two users) train on the same base model; one
queues 20 steps at once, and the other's single forward_backward does not wait behind all of them."""

from __future__ import annotations

import sqlite3
import statistics
import threading
import time
from pathlib import Path

import tinker
from tinker import types

from tests.integration.conftest import BASE_MODEL, CHUNK_LEN
from tests.integration.helpers import SENTENCES

STEPS = 20
ADAM = types.AdamParams(learning_rate=1e-3)


def _datums(tokenizer, count: int, length: int = 255) -> list[types.Datum]:
    """`count` datums of `length` tokens (sentences repeated)."""
    ids = [t for text in SENTENCES for t in tokenizer.encode(text)]
    ids = (ids * (length // len(ids) + 2))[: length + 1]
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(ids[:-1]),
        loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * length},
    )
    return [datum] * count


def last_queued_seq(state_dir: Path, model_id: str) -> int:
    """The model's highest seq_id the ingress has accepted (its future exists; the trainer gets it at once)."""
    with sqlite3.connect(state_dir / "tinker_serve.db") as db:
        query = "SELECT coalesce(max(seq_id), 0) FROM futures WHERE subject_id = ?"
        return db.execute(query, (model_id,)).fetchone()[0]


def wait_until_queued(state_dir: Path, model_id: str, seq_id: int, budget_s: float = 120) -> None:
    deadline = time.monotonic() + budget_s
    while last_queued_seq(state_dir, model_id) < seq_id:
        assert time.monotonic() < deadline, f"seq_id {seq_id} of {model_id} was never queued"
        time.sleep(0.01)


def test_a_single_step_is_not_starved_by_another_users_flood(base_url: str, state_dir: Path) -> None:
    alice_sc = tinker.ServiceClient(base_url=base_url, api_key="tml-fair-share-alice")
    bob_sc = tinker.ServiceClient(base_url=base_url, api_key="tml-fair-share-bob")
    try:
        alice = alice_sc.create_lora_training_client(base_model=BASE_MODEL, rank=8, seed=31).result()
        bob = bob_sc.create_lora_training_client(base_model=BASE_MODEL, rank=8, seed=32).result()
        # Alice's steps: 16 long datums, which the SDK sends as 4 chunks at once (CHUNK_LEN), so her steps outlast
        # their submits (~40 ms a request on 2 busy cores) and her flood really queues at the trainer. Bob's: 4.
        data, bob_data = _datums(alice.get_tokenizer(), 16), _datums(alice.get_tokenizer(), 4)
        bob.forward_backward(bob_data, "cross_entropy").result()  # warm: Bob's timed step is like any other

        step_times = []  # Alice's step, each awaited before the next
        for _ in range(3):
            started = time.perf_counter()
            alice.forward_backward(data, "cross_entropy").result()
            alice.optim_step(ADAM).result()
            step_times.append(time.perf_counter() - started)
        step = statistics.median(step_times)

        last_before = last_queued_seq(state_dir, alice.model_id)
        flood = [(alice.forward_backward(data, "cross_entropy"), alice.optim_step(ADAM)) for _ in range(STEPS)]
        done: list[float] = []  # when each of Alice's steps finished

        def wait_for_flood() -> None:
            for fb, opt in flood:
                fb.result(), opt.result()
                done.append(time.perf_counter())

        waiter = threading.Thread(target=wait_for_flood)
        waiter.start()
        chunks = -(-len(data) // CHUNK_LEN)
        wait_until_queued(state_dir, alice.model_id, last_before + (chunks + 1) * STEPS)  # all of her flood is queued
        submitted = time.perf_counter()
        bob.forward_backward(bob_data, "cross_entropy").result()
        finished = time.perf_counter()
        waiter.join(timeout=600)
        assert len(done) == STEPS

        wait = finished - submitted
        left = STEPS - sum(t < submitted for t in done)  # Alice's steps still to run when Bob came
        during = sum(submitted <= t < finished for t in done)  # hers that finished while he waited
        flood_step = (done[-1] - done[0]) / (STEPS - 1)
        print(
            f"\nBob's forward_backward under Alice's {STEPS}-step flood ({left} steps still queued): {wait:.3f} s; "
            f"Alice's step: {step:.3f} s awaited, {flood_step:.3f} s within the flood; Bob waited "
            f"{wait / flood_step:.2f} of those, and {during} of her steps finished meanwhile"
        )
        assert left >= 5  # without fair share, Bob would wait for all of these
        assert wait < 3 * flood_step
        assert during <= 3
    finally:
        alice_sc.close("success").result()
        bob_sc.close("success").result()
