"""An operation that builds but cannot be journaled (through the in-process app, tests/unit/api/conftest.py): its
future fails naming why and the trainer is told to skip its seq_id, so the request is not a 500 and the model's later
operations do not wait out the gap."""

from __future__ import annotations

from app.api.training import sequenced
from app.db.metadata import TrainingRun
from app.db.outcomes import Failed
from app.messages import AdamParams, SequencedOp, Skip
from app.operations.optim_step import OptimStep
from tests.unit.api.conftest import InProcessApi
from tests.unit.api.test_quotas_hold import _live_model, _Trainers


def test_an_operation_the_journal_cannot_hold_is_skipped(api: InProcessApi) -> None:
    api.services.trainers = trainers = _Trainers()  # type: ignore[assignment]
    model_id = _live_model(api)

    async def build(request_id: str, run: TrainingRun) -> SequencedOp:
        return OptimStep(request_id, AdamParams(learning_rate=2**70))  # msgpack holds 64-bit integers

    answer = api.run(sequenced(api.services, api.user_id(), "optim_step", model_id, 1, build))
    outcome = api.run(api.services.futures.get(answer["request_id"]))
    assert isinstance(outcome, Failed) and "is not journaled" in outcome.error["error"], outcome
    assert [(seq_id, type(op)) for seq_id, op in trainers.submitted] == [(1, Skip)]
