"""Datum provenance spans on the wire (protobuf `ProvenanceSpan`, and its proto3 JSON form in JSON bodies):
decoded into app.training_data.batch.Provenance, every structural problem a user error naming the field."""

from __future__ import annotations

from typing import Any

from app.errors import UserError
from app.protocol.bounds import CountLimits, check_distinct_ids
from app.training_data.batch import Provenance, Span

_ARMS = {"prompt_tokens": False, "sampled_tokens": True}


def _span(field: str, sampled: bool, sequence_id: Any, offset: Any, length: Any) -> Span:
    if not isinstance(sequence_id, str) or not sequence_id:
        raise UserError(f"{field}.sequence_id must be a non-empty string", field=f"{field}.sequence_id")
    for name, value in (("offset", offset), ("length", length)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise UserError(f"{field}.{name} must be an integer >= 0, got {value!r}", field=f"{field}.{name}")
    return Span(sampled, sequence_id, offset, length)


def _pair(
    field: str, model_input: tuple[Span, ...], loss_fn_inputs: tuple[Span, ...], present: tuple[bool, bool]
) -> Provenance | None:
    if present == (False, False):
        return None
    if present != (True, True):
        raise UserError(
            f"{field}: provenance comes as a pair: send model_input_spans and loss_fn_input_spans, or neither",
            field=f"{field}.loss_fn_input_spans",
        )
    return Provenance(model_input, loss_fn_inputs)


def provenance_from_proto(i: int, datum: Any) -> Provenance | None:
    """A protobuf Datum's spans (None when it has none)."""
    lists = []
    for name in ("model_input_spans", "loss_fn_input_spans"):
        spans = []
        for j, msg in enumerate(getattr(datum, name)):
            field = f"data[{i}].{name}[{j}]"
            arm = msg.WhichOneof("span")
            if arm not in _ARMS:
                raise UserError(f"{field} is neither prompt_tokens nor sampled_tokens", field=field)
            run = getattr(msg, arm)
            spans.append(_span(field, _ARMS[arm], run.sequence_id, int(run.offset), int(run.length)))
        lists.append(tuple(spans))
    return _pair(f"data[{i}]", lists[0], lists[1], (bool(lists[0]), bool(lists[1])))


def provenance_from_json(i: int, datum: dict[str, Any]) -> Provenance | None:
    """A JSON datum's spans, each `{"prompt_tokens": {...}}` or `{"sampled_tokens": {...}}` (None when none)."""
    lists: list[tuple[Span, ...] | None] = []
    for name in ("model_input_spans", "loss_fn_input_spans"):
        raw = datum.get(name)
        if raw is None:
            lists.append(None)
            continue
        if not isinstance(raw, list):
            raise UserError(f"data[{i}].{name} must be a list of spans", field=f"data[{i}].{name}")
        spans = []
        for j, span in enumerate(raw):
            field = f"data[{i}].{name}[{j}]"
            arms = [a for a in _ARMS if isinstance(span, dict) and a in span]
            if len(arms) != 1 or not isinstance(span[arms[0]], dict):
                raise UserError(f"{field} must be an object with one of prompt_tokens, sampled_tokens", field=field)
            run = span[arms[0]]
            spans.append(_span(field, _ARMS[arms[0]], run.get("sequence_id"), run.get("offset", 0), run.get("length")))
        lists.append(tuple(spans))
    return _pair(f"data[{i}]", lists[0] or (), lists[1] or (), (lists[0] is not None, lists[1] is not None))


def collect(provenance: list[Provenance | None], counts: CountLimits) -> tuple[Provenance | None, ...]:
    """Each datum's provenance, or () when no datum has any; refused when the spans name more distinct sequence ids
    than limits.max_distinct_sequence_ids_per_request (each one is a stability record to read)."""
    ids: set[str] = set()
    for i, p in enumerate(provenance):
        named = (("model_input_spans", p.model_input), ("loss_fn_input_spans", p.loss_fn_inputs)) if p else ()
        for name, spans in named:
            for j, span in enumerate(spans):
                if span.sequence_id not in ids:
                    ids.add(span.sequence_id)
                    check_distinct_ids(f"data[{i}].{name}[{j}].sequence_id", len(ids), counts)
    return tuple(provenance) if any(p is not None for p in provenance) else ()
