"""forward / forward_backward: one pass (and its backward) over a batch, with the loss it names."""

from __future__ import annotations

from dataclasses import dataclass

from app.db.futures import PROTO_CONTENT_TYPE
from app.messages import ForwardBackwardArgs, ForwardBackwardCommand, SequencedOp, ShardOutput
from app.operations.base import CheckpointCommitter, HistoryStep, Operation, Reply, Traits
from app.protocol.results import encode_forward_backward_output, forward_backward_json_from_proto
from app.training_data.sharding import merge_shards

# The route decodes its body itself (app.api.training): what the OpenAPI document says of it.
OPENAPI_BODY = {
    "required": True,
    "description": "A tinker ForwardBackwardRequest: protobuf (the SDK's), or JSON from older SDKs; "
    "Content-Encoding zstd or none.",
    "content": {
        "application/x-protobuf": {"schema": {"type": "string", "format": "binary"}},
        "application/json": {
            "schema": {
                "type": "object",
                "required": ["model_id", "seq_id", "forward_backward_input"],
                "properties": {
                    "model_id": {"type": "string"},
                    "seq_id": {"type": "integer", "minimum": 1},
                    "forward_backward_input": {"type": "object"},
                },
            }
        },
    },
}


@dataclass(frozen=True)
class ForwardBackward(SequencedOp):
    args: ForwardBackwardArgs


class ForwardBackwardOperation(Operation[ForwardBackward, ShardOutput]):
    message = ForwardBackward
    calls = ("forward_backward",)
    traits = Traits(
        carries_batch=True, json_view=forward_backward_json_from_proto, openapi_body=OPENAPI_BODY, runs=True
    )

    def name(self, op: ForwardBackward) -> str:
        return "forward" if op.args.forward_only else "forward_backward"

    def command(self, model_id: str, op: ForwardBackward) -> ForwardBackwardCommand:
        return ForwardBackwardCommand(model_id, op.args)

    def forward(self, op: ForwardBackward) -> ForwardBackwardArgs:
        return op.args

    async def reply(
        self, model_id: str, op: ForwardBackward, per_rank: list[ShardOutput], committer: CheckpointCommitter
    ) -> Reply:
        result = merge_shards(op.args.batch.offsets, per_rank)
        cost = max(shard.loss_cost_tokens for shard in per_rank)
        return Reply(encode_forward_backward_output(result), PROTO_CONTENT_TYPE, result.metrics, cost)

    def changes_model(self, op: ForwardBackward) -> bool:
        return not op.args.forward_only  # its gradients

    def counts_toward_snapshot(self, op: ForwardBackward) -> bool:
        return False  # a snapshot right after a step finds no gradients to keep

    def cost(self, op: ForwardBackward, fixed_cost: int) -> int:
        return self.usage_tokens(op)

    def history(self, op: ForwardBackward) -> HistoryStep:
        return HistoryStep(tokens=self.usage_tokens(op))

    def trained_tokens(self, op: ForwardBackward) -> int:
        return 0 if op.args.forward_only else self.usage_tokens(op)

    def usage_tokens(self, op: ForwardBackward) -> int:
        return op.args.batch.num_tokens
