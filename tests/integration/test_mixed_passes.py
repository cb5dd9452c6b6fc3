"""Many users, one pass, through the real SDK: four users step concurrently on the shared tiny base; their ready
forward_backwards run as one pass over the base (worker_group.mixed_pass_models), each row through its own model's
adapter. Each user's losses equal the same steps run alone, each loss falls, and the journal keeps the passes'
layouts, which replay them bit for bit in a rebuild (tests/unit/trainer/test_rebuild.py)."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import tinker
from tinker import types

from app.db import journal_codec
from app.messages import PassLayout
from tests.integration.conftest import BASE_MODEL
from tests.integration.helpers import random_datums

USERS = 4
STEPS = 3
ADAM = types.AdamParams(learning_rate=1e-2)


def _losses(tc: tinker.TrainingClient, data: list[types.Datum], *, at_once: bool) -> list[float]:
    """The loss of each of STEPS steps on `data`; `at_once`: every step submitted before any is awaited."""
    if at_once:
        futures = [(tc.forward_backward(data, "cross_entropy"), tc.optim_step(ADAM)) for _ in range(STEPS)]
        return [fb.result().metrics["loss:sum"] for fb, opt in futures if opt.result() is not None]
    losses = []
    for _ in range(STEPS):
        losses.append(tc.forward_backward(data, "cross_entropy").result().metrics["loss:sum"])
        tc.optim_step(ADAM).result()
    return losses


def _layouts(state_dir: Path, model_ids: list[str]) -> list[PassLayout]:
    with sqlite3.connect(state_dir / "tinker_serve.db") as db:
        marks = ",".join("?" * len(model_ids))
        query = f"SELECT layout FROM journal WHERE layout IS NOT NULL AND model_id IN ({marks})"
        return [journal_codec.decode_tree(row[0]) for row in db.execute(query, model_ids)]


def test_concurrent_users_share_passes_and_each_gets_exactly_their_own_step(base_url: str, state_dir: Path) -> None:
    clients = [tinker.ServiceClient(base_url=base_url, api_key=f"tml-mixed-{user}") for user in range(USERS)]
    data = [random_datums(2, 12 + 5 * user, seed=300 + user) for user in range(USERS)]
    together = [
        sc.create_lora_training_client(base_model=BASE_MODEL, rank=4 + 4 * (u % 2), seed=u).result()
        for u, sc in enumerate(clients)
    ]
    mixed_losses: list[list[float]] = [[] for _ in range(USERS)]

    def user(u: int) -> None:
        mixed_losses[u] = _losses(together[u], data[u], at_once=True)

    threads = [threading.Thread(target=user, args=(u,)) for u in range(USERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    layouts = _layouts(state_dir, [tc.model_id for tc in together])
    assert layouts and max(len(layout.members) for layout in layouts) >= 2  # some steps ran as one pass
    for u in range(USERS):
        alone = clients[u].create_lora_training_client(base_model=BASE_MODEL, rank=4 + 4 * (u % 2), seed=u).result()
        solo_losses = _losses(alone, data[u], at_once=False)
        assert mixed_losses[u][-1] < mixed_losses[u][0]  # it learns
        for mixed, solo in zip(mixed_losses[u], solo_losses, strict=True):
            assert abs(mixed - solo) <= 1e-4 * abs(solo), (u, mixed_losses[u], solo_losses)
