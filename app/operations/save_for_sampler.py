"""save_weights_for_sampler without a name: the model's adapter for an ephemeral sampling session."""

from __future__ import annotations

from dataclasses import dataclass

from app.messages import SaveCommand, SequencedOp
from app.operations.base import CONTROL, CheckpointCommitter, HistoryStep, Operation, Reply


@dataclass(frozen=True)
class SaveForSampler(SequencedOp):
    """Write the model's adapter at `location` for the ephemeral sampling session `sampling_session_id`."""

    sampling_session_id: str
    location: str


class SaveForSamplerOperation(Operation[SaveForSampler, int]):
    message = SaveForSampler
    calls = ("save_weights_for_sampler",)
    traits = CONTROL

    def name(self, op: SaveForSampler) -> str:
        return "save_weights_for_sampler"

    def command(self, model_id: str, op: SaveForSampler) -> SaveCommand:
        return SaveCommand(model_id, op.location, "adapter")

    def forward(self, op: SaveForSampler) -> None:
        return None

    async def reply(
        self, model_id: str, op: SaveForSampler, per_rank: list[int], committer: CheckpointCommitter
    ) -> Reply:
        return Reply.json({"sampling_session_id": op.sampling_session_id, "type": self.name(op)})

    def changes_model(self, op: SaveForSampler) -> bool:
        return False

    def counts_toward_snapshot(self, op: SaveForSampler) -> bool:
        return False

    def cost(self, op: SaveForSampler, fixed_cost: int) -> int:
        return fixed_cost

    def history(self, op: SaveForSampler) -> HistoryStep | None:
        return None

    def trained_tokens(self, op: SaveForSampler) -> int:
        return 0

    def usage_tokens(self, op: SaveForSampler) -> int:
        return 0
