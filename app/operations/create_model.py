"""create_model (and load_weights creating a model from a checkpoint): the model's seq_id 0, which adds its adapter
on the shared base and, with `load`, fills it from a training checkpoint in the same step."""

from __future__ import annotations

from dataclasses import dataclass

from app.messages import AdapterSpec, CreateModelCommand, SequencedOp
from app.operations.base import CONTROL, CheckpointCommitter, HistoryStep, Operation, Reply
from app.operations.load_checkpoint import LoadCheckpoint, LoadCheckpointOperation


@dataclass(frozen=True)
class CreateModel(SequencedOp):
    """Create a model (its seq_id 0); with `load`, fill it from a checkpoint in the same step."""

    spec: AdapterSpec
    load: LoadCheckpoint | None = None


class CreateModelOperation(Operation[CreateModel, None]):
    """Run by the trainer's create path (its command, then its load's: app.trainer.recovery.creation_commands), not
    its queue; a rebuild starts from it or from a snapshot, and replays nothing of it."""

    message = CreateModel
    calls = ("create_model",)
    traits = CONTROL

    def name(self, op: CreateModel) -> str:
        return "create_model"

    def command(self, model_id: str, op: CreateModel) -> CreateModelCommand:
        return CreateModelCommand(model_id, op.spec)

    def forward(self, op: CreateModel) -> None:
        return None

    async def reply(
        self, model_id: str, op: CreateModel, per_rank: list[None], committer: CheckpointCommitter
    ) -> Reply:
        """`per_rank`: each rank's reply to the creation's last command (its load's, if it loads)."""
        if op.load is None:
            return Reply.json({"model_id": model_id, "type": self.name(op)})
        return await LoadCheckpointOperation().reply(model_id, op.load, per_rank, committer)

    def changes_model(self, op: CreateModel) -> bool:
        return False  # what a rebuild starts from, not what it replays

    def counts_toward_snapshot(self, op: CreateModel) -> bool:
        return False

    def cost(self, op: CreateModel, fixed_cost: int) -> int:
        return fixed_cost

    def history(self, op: CreateModel) -> HistoryStep | None:
        return None

    def trained_tokens(self, op: CreateModel) -> int:
        return 0

    def usage_tokens(self, op: CreateModel) -> int:
        return 0
