"""save_weights, save_weights_for_sampler (named) and save_weights_external: write the model as a checkpoint, then
make it visible."""

from __future__ import annotations

from dataclasses import dataclass

from app.db.checkpoints import CheckpointRecord
from app.messages import SaveCommand, SavedParts, SequencedOp
from app.operations.base import CONTROL, CheckpointCommitter, HistoryStep, Operation, Reply

# A checkpoint's kind -> the call that saves it, and what its ranks write.
_SAVES: dict[str, tuple[str, SavedParts]] = {
    "weights": ("save_weights", "state"),
    "sampler_weights": ("save_weights_for_sampler", "adapter"),
    "external_weights": ("save_weights_external", "export"),
}


@dataclass(frozen=True)
class SaveCheckpoint(SequencedOp):
    """Write the model's weights as the checkpoint `record` (its path's kind says what is written), then make it
    visible, replacing one of the same name only with `overwrite`."""

    record: CheckpointRecord
    overwrite: bool = False


class SaveCheckpointOperation(Operation[SaveCheckpoint, int]):
    message = SaveCheckpoint
    calls = tuple(call for call, _ in _SAVES.values())
    traits = CONTROL

    def name(self, op: SaveCheckpoint) -> str:
        return _SAVES[op.record.path.kind][0]

    def command(self, model_id: str, op: SaveCheckpoint) -> SaveCommand:
        return SaveCommand(model_id, op.record.location, _SAVES[op.record.path.kind][1])

    def forward(self, op: SaveCheckpoint) -> None:
        return None

    async def reply(
        self, model_id: str, op: SaveCheckpoint, per_rank: list[int], committer: CheckpointCommitter
    ) -> Reply:
        await committer.commit(op.record, size_bytes=per_rank[0], overwrite=op.overwrite)
        return Reply.json({"path": op.record.path.uri, "type": self.name(op)})

    def changes_model(self, op: SaveCheckpoint) -> bool:
        return False

    def counts_toward_snapshot(self, op: SaveCheckpoint) -> bool:
        return False

    def cost(self, op: SaveCheckpoint, fixed_cost: int) -> int:
        return fixed_cost

    def history(self, op: SaveCheckpoint) -> HistoryStep | None:
        return None

    def trained_tokens(self, op: SaveCheckpoint) -> int:
        return 0

    def usage_tokens(self, op: SaveCheckpoint) -> int:
        return 0
