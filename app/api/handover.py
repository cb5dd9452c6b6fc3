"""Handing over again what a dead ingress replica only promised: an operation answered to its client (its future
created, the journal holding it) whose hand-over to the trainer was lost with the replica. The client only polls the
future, so no retry brings it back; each ingress replica asks the trainers now and then which of the operations
pending that long they never received, and hands those over (a trainer ignores one it already holds)."""

from __future__ import annotations

import itertools
import time

from app.api.deps import Services
from app.errors import TinkerServeError
from app.operations import operation
from app.request_log import log_request


async def hand_over_again(services: Services, pending_s: float) -> int:
    """Hand over the journaled operations pending `pending_s` or longer that their trainers never received; returns
    how many. Only their ids are read until a trainer names the ones it lacks: only those are loaded."""
    pending = await services.journal.pending_since(time.time() - pending_s)
    handed = 0
    for model_id, group in itertools.groupby(pending, key=lambda entry: entry[0]):
        seq_ids = [seq_id for _, seq_id in group]
        try:
            run = await services.metadata.get_training_run(model_id)
        except TinkerServeError:  # its run is gone: nothing will run it
            continue
        user = await services.metadata.owner_of(run.session_id) or ""
        try:
            missing = await services.trainers.missing(run.trainer, model_id, seq_ids)
        except Exception:  # noqa: BLE001 - its trainer is away (a replica restarting): the next round asks again
            continue
        ops = await services.journal.ops(model_id, missing) if missing else {}
        for seq_id, op in sorted(ops.items()):
            log_request(
                "handed over again", op=operation(op).name(op), model_id=model_id, seq_id=seq_id,
                tinker_request_id=op.request_id, trainer=run.trainer,
            )  # fmt: skip
            services.trainers.submit(run.trainer, model_id, seq_id, op, user)
            handed += 1
    return handed
