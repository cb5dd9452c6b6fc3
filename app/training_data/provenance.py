"""stable_reinforce's server-side inputs: each datum's provenance spans checked against the session's stability
records, and the sampler logprobs those records hold, placed at the positions they score.

A datum's `model_input` spans tile its input tokens and its `loss_fn_inputs` spans tile its target tokens; a span
claims `length` tokens from `offset` of a recorded sequence's sampled tokens or of its prompt. Every claim is
checked token by token, so the recorded behaviour logprobs can only be used for the tokens the sampler produced;
only prompt claims among the targets are not (they score nothing, and the cookbook's rl_loop.py pads them with 0).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from app.db.stability import StabilityRecord
from app.errors import UserError
from app.training_data.batch import ForwardBackwardInput, Span
from app.training_data.losses import SAMPLED_MASK, SAMPLER_LOGPROBS


def referenced_sequences(inp: ForwardBackwardInput) -> set[str]:
    """Every sequence_id the request's spans name."""
    return {s.sequence_id for p in inp.provenance if p for s in (*p.model_input, *p.loss_fn_inputs)}


def _check_spans(
    field: str,
    spans: tuple[Span, ...],
    tokens: np.ndarray,
    records: Mapping[str, StabilityRecord],
    *,
    prompt_tokens_checked: bool,
) -> None:
    """The spans tile `tokens`, and every span's tokens are the ones its record holds there (for prompt spans,
    only if `prompt_tokens_checked`)."""
    covered = sum(s.length for s in spans)
    if covered != len(tokens):
        raise UserError(f"{field} cover {covered} positions but the datum has {len(tokens)}", field=field)
    position = 0
    for j, span in enumerate(spans):
        record = records.get(span.sequence_id)
        if record is None:
            raise UserError(
                f"{field}[{j}] names sequence_id {span.sequence_id!r}, which has no stability record in "
                "this session (unknown, or expired): sample with record_stability_info=True",
                field=f"{field}[{j}].sequence_id",
            )
        source = record.tokens if span.sampled else record.prompt
        part = "sampled tokens" if span.sampled else "prompt"
        if span.offset + span.length > len(source):
            raise UserError(
                f"{field}[{j}] claims {part} [{span.offset}, {span.offset + span.length}) of "
                f"{span.sequence_id!r}, which has {len(source)}",
                field=f"{field}[{j}]",
            )
        claimed = source[span.offset : span.offset + span.length]
        mismatch = np.flatnonzero(tokens[position : position + span.length] != claimed)
        if mismatch.size and (span.sampled or prompt_tokens_checked):
            k = int(mismatch[0])
            raise UserError(
                f"{field}[{j}]: position {position + k} holds token {int(tokens[position + k])}, but "
                f"{span.sequence_id!r} has {int(claimed[k])} there",
                field=f"{field}[{j}]",
            )
        position += span.length


def behaviour_inputs(inp: ForwardBackwardInput, records: Mapping[str, StabilityRecord]) -> dict[str, np.ndarray]:
    """The per-token arrays stable_reinforce reads besides the user's inputs, after checking every datum's
    provenance: the recorded sampler logprob of each sampled target (0 elsewhere) and a mask of sampled targets.
    User errors name the datum, span and position."""
    batch = inp.batch
    targets, advantages = batch.loss_inputs["target_tokens"], batch.loss_inputs["advantages"]
    sampler_logprobs = np.zeros(len(batch.tokens), np.float32)
    sampled = np.zeros(len(batch.tokens), np.float32)
    for i in range(batch.num_datums):
        provenance = inp.provenance[i] if i < len(inp.provenance) else None
        if provenance is None:
            raise UserError(
                f"data[{i}] has no provenance: stable_reinforce needs model_input_spans and "
                "loss_fn_input_spans on every datum (Datum.with_provenance)",
                field=f"data[{i}].loss_fn_input_spans",
            )
        rows = batch.datum_slice(i)
        _check_spans(
            f"data[{i}].model_input_spans",
            provenance.model_input,
            batch.tokens[rows],
            records,
            prompt_tokens_checked=True,
        )
        _check_spans(
            f"data[{i}].loss_fn_input_spans",
            provenance.loss_fn_inputs,
            targets[rows],
            records,
            prompt_tokens_checked=False,
        )
        position = rows.start
        for span in provenance.loss_fn_inputs:
            here = slice(position, position + span.length)
            if span.sampled:
                record = records[span.sequence_id]
                sampler_logprobs[here] = record.logprobs[span.offset : span.offset + span.length]
                sampled[here] = 1.0
            else:
                nonzero = np.flatnonzero(advantages[here])
                if nonzero.size:
                    at = position - rows.start + int(nonzero[0])
                    raise UserError(
                        f"data[{i}].loss_fn_inputs.advantages is nonzero at position {at}, a prompt "
                        "token: stable_reinforce trains only sampled tokens",
                        field=f"data[{i}].loss_fn_inputs.advantages",
                    )
            position += span.length
    return {SAMPLER_LOGPROBS: sampler_logprobs, SAMPLED_MASK: sampled}
