"""optim_step: one step of the model's optimizer with the hyper-parameters the request sends."""

from __future__ import annotations

from dataclasses import dataclass, replace

from app.messages import OptimParams, OptimStepCommand, SequencedOp
from app.operations.base import CONTROL, CheckpointCommitter, HistoryStep, Operation, Reply


@dataclass(frozen=True)
class OptimStep(SequencedOp):
    params: OptimParams


class OptimStepOperation(Operation[OptimStep, dict[str, float]]):
    message = OptimStep
    calls = ("optim_step",)
    traits = CONTROL

    def name(self, op: OptimStep) -> str:
        return "optim_step"

    def command(self, model_id: str, op: OptimStep) -> OptimStepCommand:
        return OptimStepCommand(model_id, op.params)

    def forward(self, op: OptimStep) -> None:
        return None

    async def reply(
        self, model_id: str, op: OptimStep, per_rank: list[dict[str, float]], committer: CheckpointCommitter
    ) -> Reply:
        return replace(Reply.json({"metrics": per_rank[0]}), metrics=per_rank[0])

    def changes_model(self, op: OptimStep) -> bool:
        return True

    def counts_toward_snapshot(self, op: OptimStep) -> bool:
        return True

    def cost(self, op: OptimStep, fixed_cost: int) -> int:
        return fixed_cost

    def history(self, op: OptimStep) -> HistoryStep:
        return HistoryStep(learning_rate=op.params.learning_rate, finishes_step=True)

    def trained_tokens(self, op: OptimStep) -> int:
        return 0

    def usage_tokens(self, op: OptimStep) -> int:
        return 0
