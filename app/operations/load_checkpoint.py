"""load_weights (and create_model from a checkpoint): fill the model from a training checkpoint."""

from __future__ import annotations

from dataclasses import dataclass

from app.messages import LoadStateCommand, SequencedOp
from app.operations.base import CONTROL, CheckpointCommitter, HistoryStep, Operation, Reply


@dataclass(frozen=True)
class LoadCheckpoint(SequencedOp):
    """Fill the model from the training checkpoint `path` stored at `location`."""

    path: str  # tinker://
    location: str
    with_optimizer: bool


class LoadCheckpointOperation(Operation[LoadCheckpoint, None]):
    message = LoadCheckpoint
    calls = ("load_weights",)
    traits = CONTROL

    def name(self, op: LoadCheckpoint) -> str:
        return "load_weights"

    def command(self, model_id: str, op: LoadCheckpoint) -> LoadStateCommand:
        return LoadStateCommand(model_id, op.location, op.with_optimizer)

    def forward(self, op: LoadCheckpoint) -> None:
        return None

    async def reply(
        self, model_id: str, op: LoadCheckpoint, per_rank: list[None], committer: CheckpointCommitter
    ) -> Reply:
        return Reply.json({"path": op.path, "model_id": model_id, "type": self.name(op)})

    def changes_model(self, op: LoadCheckpoint) -> bool:
        return True

    def counts_toward_snapshot(self, op: LoadCheckpoint) -> bool:
        return True  # a snapshot after a load spares replaying it from the checkpoint

    def cost(self, op: LoadCheckpoint, fixed_cost: int) -> int:
        return fixed_cost

    def history(self, op: LoadCheckpoint) -> HistoryStep | None:
        return None

    def trained_tokens(self, op: LoadCheckpoint) -> int:
        return 0

    def usage_tokens(self, op: LoadCheckpoint) -> int:
        return 0
