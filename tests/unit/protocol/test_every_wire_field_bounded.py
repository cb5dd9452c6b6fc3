"""Every list, map, string and integer a route's request body carries has a bound (issue 45): a length (`max_length`),
a range (both `ge`/`gt` and `le`/`lt`), or a configured one (app.protocol.field_limits.Limit). The models are found
from the app's routes, so a new route's body is covered without a line here; nested models are walked too. Fields
bounded elsewhere are listed in EXEMPT, each with where."""

from __future__ import annotations

import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types as at
from fastapi.routing import APIRoute
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from app.api.main import create_api
from app.protocol.field_limits import SIZES_CONTENTS, Limit

# model.field -> where its bound is applied
EXEMPT = {
    "CreateCustomLossRequest.inputs": "a fixed few inputs, each checked (app.training_data.custom_losses) before the "
    "loss is stored",
    "CreateCustomLossRequest.graph": "its nodes against limits.max_custom_loss_nodes, each checked (the same)",
    "SampleRequest.prompt": "chunks and tokens counted against the model's context before they are read "
    "(app.sampling.params.prompt_tokens)",
    "CompletionRequest.prompt": "prompts x n against limits.max_num_samples (app.api.openai); each prompt's tokens "
    "against the context by vLLM; the body by limits.max_sample_request_bytes",
    "ChatRequest.messages": "tokens against the context by vLLM; the body by limits.max_sample_request_bytes",
    "MessagesRequest.messages": "as ChatRequest.messages (app.api.anthropic)",
    "MessagesRequest.system": "as ChatRequest.messages (app.api.anthropic)",
    "CountTokensRequest.messages": "as ChatRequest.messages (app.api.anthropic)",
    "CountTokensRequest.system": "as ChatRequest.messages (app.api.anthropic)",
}

# request models that take fields they do not declare (extra="allow") -> where those go
OPEN = {
    "CompletionRequest": "every undeclared field goes to vLLM, which validates the whole body; those it applies at "
    "every token or compiles first (stops, bad_words, biases, structured outputs) are declared, so bounded here",
    "ChatRequest": "the same",
    "MessagesRequest": "the same, through vLLM's Anthropic request models (app.api.anthropic)",
    "CountTokensRequest": "the same",
}


def _bounds(metadata: list[Any]) -> tuple[set[str], bool]:
    """(what the metadata bounds: 'length', 'low', 'high'; whether it sizes a container's contents too)."""
    found, contents = set(), False
    flat = [n for item in metadata for n in (item.metadata if isinstance(item, FieldInfo) else [item])]
    for m in flat:
        if isinstance(m, Limit):
            if m.measure != "words":
                found.add("length")
            contents |= m.measure in SIZES_CONTENTS
        elif isinstance(m, at.MaxLen):
            found.add("length")
        elif isinstance(m, (at.Ge, at.Gt)):
            found.add("low")
        elif isinstance(m, (at.Le, at.Lt)):
            found.add("high")
        elif isinstance(m, at.Interval):
            found |= {"low"} if m.ge is not None or m.gt is not None else set()
            found |= {"high"} if m.le is not None or m.lt is not None else set()
    return found, contents


def _unbounded(tp: Any, where: str, metadata: list[Any], seen: set[type]) -> list[str]:
    """The paths under `where` (a value of type `tp` carrying `metadata`) with no bound."""
    if get_origin(tp) is Annotated:
        inner, *extra = get_args(tp)
        return _unbounded(inner, where, [*metadata, *extra], seen)
    bounds, contents = _bounds(metadata)
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        return [p for member in get_args(tp) for p in _unbounded(member, where, metadata, seen)]
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return _model_unbounded(tp, f"{where}.", seen)
    if tp in (type(None), bool, float) or origin is Literal:
        return []
    if tp is str:
        return [] if "length" in bounds else [where]
    if tp is int:
        return [] if {"low", "high"} <= bounds else [where]
    if origin in (list, dict):
        missing = [] if "length" in bounds else [where]
        if contents:  # a size over everything inside bounds the items too
            return missing
        return missing + [p for arg in get_args(tp) for p in _unbounded(arg, f"{where}[]", [], seen)]
    return [] if contents else [where]  # Any, or a type this walk does not know: bounded only as a whole


def _model_unbounded(model: type[BaseModel], prefix: str, seen: set[type]) -> list[str]:
    """The unbounded fields of `model` (each model once), named `prefix` + the field (the model's name at the top)."""
    if model in seen:
        return []
    seen.add(model)
    prefix = prefix or f"{model.__name__}."
    found = []
    for name, info in model.model_fields.items():
        if f"{model.__name__}.{name}" not in EXEMPT:
            found += _unbounded(info.annotation, f"{prefix}{name}", list(info.metadata), seen)
    return found


def _request_models() -> list[type[BaseModel]]:
    models = []
    for route in create_api().routes:
        if isinstance(route, APIRoute):
            for param in route.dependant.body_params:
                annotation = param.field_info.annotation
                if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                    models.append(annotation)
    return models


def test_every_request_field_has_a_bound() -> None:
    models = _request_models()
    assert {"SampleRequest", "CreateSessionRequest", "SessionSearchRequest", "ChatRequest"} <= {
        m.__name__ for m in models
    }
    assert set(EXEMPT) <= {f"{m.__name__}.{f}" for m in models for f in m.model_fields}
    assert {m.__name__ for m in models if m.model_config.get("extra") == "allow"} == set(OPEN)
    seen: set[type] = set()
    unbounded = [path for model in models for path in _model_unbounded(model, "", seen)]
    assert unbounded == [], f"fields without a bound: {unbounded}"


def test_the_walk_finds_an_unbounded_field() -> None:
    class Body(BaseModel):
        ok: Annotated[list[str], Limit("max_stop_chars", "total_chars"), Limit("max_stop_sequences", "items")]
        words: list[Annotated[str, at.MaxLen(3)]]
        count: Annotated[int, at.Ge(0)]
        anything: dict[str, Any] | None = None

    # the list's length, the integer's top, the map, its keys and its values
    unbounded = ["Body.words", "Body.count", "Body.anything", "Body.anything[]", "Body.anything[]"]
    assert _model_unbounded(Body, "", set()) == unbounded
