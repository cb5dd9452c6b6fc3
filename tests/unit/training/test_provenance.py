"""stable_reinforce's provenance checks (app.training_data.provenance) on hand-built requests and records: the
recorded sampler logprobs land on the sampled targets, and every false claim is a user error naming the datum,
span and position."""

from __future__ import annotations

import numpy as np
import pytest

from app.db.stability import StabilityRecord
from app.errors import UserError
from app.training_data.batch import ForwardBackwardInput, PackedBatch, Provenance, Span
from app.training_data.losses import SAMPLED_MASK, SAMPLER_LOGPROBS
from app.training_data.provenance import behaviour_inputs, referenced_sequences

PROMPT, SAMPLED, LOGPROBS = [1, 40, 41], [7, 8, 9], [-0.5, -1.5, -2.5]
RECORDS = {
    "r:0": StabilityRecord(
        "r:0", "s", None, np.array(PROMPT, np.int32), np.array(SAMPLED, np.int32), np.array(LOGPROBS, np.float32)
    )
}


def _request(
    tokens: list[int], targets: list[int], advantages: list[float], provenance: Provenance | None
) -> ForwardBackwardInput:
    batch = PackedBatch(
        np.array(tokens, np.int64),
        np.array([0, len(tokens)], np.int64),
        {"target_tokens": np.array(targets, np.int64), "advantages": np.array(advantages, np.float32)},
    )
    return ForwardBackwardInput("m", 1, "stable_reinforce", {}, False, batch, (provenance,))


def _cookbook_datum(
    advantages: list[float] | None = None,
    mi_sampled: list[int] | None = None,
    targets: list[int] | None = None,
    sequence_id: str = "r:0",
) -> ForwardBackwardInput:
    """As the cookbook's loops build it: input = prompt + sampled[:-1], targets = input shifted by one."""
    spans = Provenance(
        (Span(False, sequence_id, 0, 3), Span(True, sequence_id, 0, 2)),
        (Span(False, sequence_id, 1, 2), Span(True, sequence_id, 0, 3)),
    )
    return _request(
        PROMPT + (mi_sampled or SAMPLED[:2]),
        targets or PROMPT[1:] + SAMPLED,
        advantages or [0.0, 0.0, 1.0, 1.0, 1.0],
        spans,
    )


def test_recorded_logprobs_land_on_the_sampled_targets() -> None:
    inp = _cookbook_datum()
    assert referenced_sequences(inp) == {"r:0"}
    arrays = behaviour_inputs(inp, RECORDS)
    assert arrays[SAMPLER_LOGPROBS].tolist() == [0.0, 0.0, *LOGPROBS]
    assert arrays[SAMPLED_MASK].tolist() == [0.0, 0.0, 1.0, 1.0, 1.0]


def test_prompt_targets_are_not_checked_as_recipes_pad_them() -> None:
    """recipes/rl_loop.py sets the targets of prompt positions to 0: they score nothing, so they are not checked."""
    arrays = behaviour_inputs(_cookbook_datum(targets=[0, 0, *SAMPLED]), RECORDS)
    assert arrays[SAMPLER_LOGPROBS].tolist() == [0.0, 0.0, *LOGPROBS]


@pytest.mark.parametrize(
    ("inp", "field", "message"),
    [
        (_request([1, 40], [40, 41], [0.0, 1.0], None), "data[0].loss_fn_input_spans", "no provenance"),
        (_cookbook_datum(sequence_id="gone:0"), "data[0].model_input_spans[0].sequence_id", "no stability record"),
        (_cookbook_datum(mi_sampled=[7, 99]), "data[0].model_input_spans[1]", "position 4 holds token 99"),
        (_cookbook_datum(targets=[40, 41, 7, 8, 5]), "data[0].loss_fn_input_spans[1]", "position 4 holds token 5"),
        (_cookbook_datum(advantages=[0.0, 0.5, 1.0, 1.0, 1.0]), "data[0].loss_fn_inputs.advantages", "position 1"),
        (
            _request(
                [1, 40], [40, 41], [0.0, 1.0], Provenance((Span(False, "r:0", 0, 2),), (Span(True, "r:0", 0, 1),))
            ),
            "data[0].loss_fn_input_spans",
            "cover 1 positions but the datum has 2",
        ),
        (
            _request(
                [1, 40], [40, 41], [0.0, 1.0], Provenance((Span(False, "r:0", 2, 2),), (Span(True, "r:0", 0, 2),))
            ),
            "data[0].model_input_spans[0]",
            "claims prompt [2, 4)",
        ),
    ],
)
def test_false_claims_are_user_errors_naming_where(inp: ForwardBackwardInput, field: str, message: str) -> None:
    with pytest.raises(UserError, match=message.replace("[", r"\[").replace(")", r"\)")) as info:
        behaviour_inputs(inp, RECORDS)
    assert info.value.field == field
