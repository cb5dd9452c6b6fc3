"""A Skip: the seq_id of a request refused before it could run (its future failed already), which only advances its
model's order."""

from __future__ import annotations

from typing import NoReturn

from app.messages import Skip
from app.operations.base import CheckpointCommitter, HistoryStep, Operation, Traits


class SkipOperation(Operation[Skip, None]):
    """Nothing runs (`runs` False): the trainer sends it to no rank and writes no outcome, so it has no command or
    reply; it costs nothing and changes nothing."""

    message = Skip
    calls = ()  # built by the server (for a refused request), never asked for
    traits = Traits(carries_batch=False, json_view=None, openapi_body=None, runs=False)

    def name(self, op: Skip) -> str:
        return "skip"

    def command(self, model_id: str, op: Skip) -> NoReturn:
        raise TypeError("a Skip runs nothing")

    def forward(self, op: Skip) -> None:
        return None

    async def reply(self, model_id: str, op: Skip, per_rank: list[None], committer: CheckpointCommitter) -> NoReturn:
        raise TypeError("a Skip has no reply: its future failed when it was refused")

    def changes_model(self, op: Skip) -> bool:
        return False

    def counts_toward_snapshot(self, op: Skip) -> bool:
        return False

    def cost(self, op: Skip, fixed_cost: int) -> int:
        return 0

    def history(self, op: Skip) -> HistoryStep | None:
        return None

    def trained_tokens(self, op: Skip) -> int:
        return 0

    def usage_tokens(self, op: Skip) -> int:
        return 0
