"""The OpenAPI document: FastAPI's generated schema plus what it cannot infer from the routes.

- links from the operations that create an id (sessions, models, sampling sessions, futures, checkpoints) to the
  operations that take it, so clients and fuzzers can chain calls;
- the bodies that routes decode themselves (forward_backward's: protobuf, or JSON from older SDKs, optionally zstd),
  as their operations declare them (app.operations' traits);
- the constraints that come from the server's configuration: the served base models and the largest LoRA rank.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

from app.config import ServerConfig
from app.operations import call_traits

Op = tuple[str, str]  # (method, path) as the schema writes it

CREATE_SESSION: Op = ("post", "/api/v1/create_session")
CREATE_MODEL: Op = ("post", "/api/v1/create_model")
CREATE_SAMPLER: Op = ("post", "/api/v1/create_sampling_session")
RUN_CHECKPOINTS: Op = ("get", "/api/v1/training_runs/{run_id}/checkpoints")
CHECKPOINT = "/api/v1/training_runs/{run_id}/checkpoints/{checkpoint_id}"


def _posts(*names: str) -> tuple[Op, ...]:
    return tuple(("post", f"/api/v1/{name}") for name in names)


# Operations answering {"request_id": ..., "model_id": ...}: a future of a model's operation.
MODEL_FUTURES = _posts(*call_traits())
TAKES_REQUEST_ID = _posts("retrieve_future", "cancel_future")
# Besides the sequenced operations whose route's model requires a model_id (`takes_model_id`).
TAKES_MODEL_ID = _posts("get_info", "unload_model")
TAKES_RUN_ID: tuple[Op, ...] = (
    ("get", "/api/v1/training_runs/{run_id}"),
    RUN_CHECKPOINTS,
    ("get", "/api/v1/training_runs/{run_id}/history"),
)
TAKES_SESSION_ID_BODY = _posts(
    "create_model",
    "create_sampling_session",
    "session_heartbeat",
    "create_custom_loss",
    "load_weights",
    "copy_weights",
    "sessions/search",
)
TAKES_SESSION_ID_PATH: tuple[Op, ...] = (
    ("post", "/api/v1/sessions/{session_id}/finish"),
    ("get", "/api/v1/sessions/{session_id}"),
    ("get", "/api/v1/sessions/{session_id}/trace_export"),
    ("put", "/api/v1/sessions/{session_id}/project"),
)
TAKES_SAMPLER_ID_BODY = _posts("asample", "join_sampling_session")
TAKES_CHECKPOINT: tuple[Op, ...] = (
    ("post", f"{CHECKPOINT}/publish"),
    ("delete", f"{CHECKPOINT}/publish"),
    ("put", f"{CHECKPOINT}/ttl"),
    ("get", f"{CHECKPOINT}/external_weights_urls"),
    ("delete", CHECKPOINT),
)


def _body(field: str, expression: str) -> dict[str, Any]:
    """A link that puts `expression` in the target's body at `field` (dotted for nested objects)."""
    value: Any = expression
    for part in reversed(field.split(".")):
        value = {part: value}
    return {"requestBody": value}


def _path(**parameters: str) -> dict[str, Any]:
    return {"parameters": {f"path.{name}": expression for name, expression in parameters.items()}}


def self_decoded() -> dict[Op, dict[str, Any]]:
    """The requestBody of each operation's call whose route decodes its body itself (its declared openapi_body)."""
    return {
        ("post", f"/api/v1/{call}"): traits.openapi_body
        for call, traits in call_traits().items()
        if traits.openapi_body is not None
    }


def takes_model_id(schema: dict[str, Any]) -> tuple[Op, ...]:
    """The operations a model's id goes into: TAKES_MODEL_ID, and every sequenced operation's call whose body is
    its route's model (in `schema`, FastAPI's) and requires a model_id."""
    components = schema["components"]["schemas"]
    taken = list(TAKES_MODEL_ID)
    for method, path in _posts(*call_traits()):
        body = schema["paths"][path][method].get("requestBody", {}).get("content", {}).get("application/json", {})
        model = components.get(body.get("schema", {}).get("$ref", "").rpartition("/")[2], {})
        if (method, path) not in self_decoded() and "model_id" in model.get("required", []):
            taken.append((method, path))
    return tuple(taken)


def links(schema: dict[str, Any]) -> list[tuple[Op, Op, dict[str, Any]]]:
    """(source, target, how the target takes the source's answer) for every id an operation creates (`schema`:
    FastAPI's, which says which bodies require a model_id)."""
    session, sampler = "$response.body#/session_id", "$response.body#/sampling_session_id"
    model, request = "$response.body#/model_id", "$response.body#/request_id"
    table = [(CREATE_SESSION, t, _body("session_id", session)) for t in TAKES_SESSION_ID_BODY]
    table += [(CREATE_SESSION, t, _path(session_id=session)) for t in TAKES_SESSION_ID_PATH]
    table += [(CREATE_MODEL, t, _body("model_id", model)) for t in takes_model_id(schema)]
    table += [(CREATE_MODEL, t, _path(run_id=model)) for t in TAKES_RUN_ID]
    table += [
        (s, t, _body("request_id", request)) for s in (*MODEL_FUTURES, *_posts("asample")) for t in TAKES_REQUEST_ID
    ]
    table += [(CREATE_SAMPLER, t, _body("sampling_session_id", sampler)) for t in TAKES_SAMPLER_ID_BODY]
    table += [(CREATE_SAMPLER, ("get", "/api/v1/samplers/{sampling_session_id}"), _path(sampling_session_id=sampler))]
    table += [(CREATE_SAMPLER, ("post", "/api/v1/retrieve_futures"), _body("target.sampling_session_id", sampler))]
    first = "$response.body#/checkpoints/0"
    table += [
        (RUN_CHECKPOINTS, t, _path(run_id="$request.path.run_id", checkpoint_id=f"{first}/checkpoint_id"))
        for t in TAKES_CHECKPOINT
    ]
    uri = f"{first}/tinker_path"
    table += [(RUN_CHECKPOINTS, ("post", "/api/v1/weights_info"), _body("tinker_path", uri))]
    table += [(RUN_CHECKPOINTS, ("post", "/api/v1/copy_weights"), _body("source_path", uri))]
    return table


def describe(schema: dict[str, Any], config: ServerConfig) -> dict[str, Any]:
    """`schema` (FastAPI's) with links, the self-decoded bodies and the configured constraints added."""
    schema = copy.deepcopy(schema)
    paths = schema["paths"]
    operation_ids = {(m, p): op["operationId"] for p, ops in paths.items() for m, op in ops.items()}
    for (method, path), target, link in links(schema):
        response = paths[path][method]["responses"].setdefault("200", {"description": "Successful Response"})
        name = operation_ids[target]
        response.setdefault("links", {})[name] = {"operationId": name, **link}
    for (method, path), body in self_decoded().items():
        paths[path][method]["requestBody"] = body
    components = schema["components"]["schemas"]
    served = [m.name for m in config.base_models]
    for model in ("CreateModelRequest", "CreateSamplingSessionRequest", "LoadWeightsRequest"):
        field = components[model]["properties"]["base_model"]
        target = next((s for s in field.get("anyOf", []) if s.get("type") == "string"), field)
        target["enum"] = served
    components["LoraConfig"]["properties"]["rank"]["maximum"] = config.engine.max_lora_rank
    return schema


def install(api: FastAPI, config: ServerConfig) -> None:
    """Serve `describe`'s document at /openapi.json (built once, on the first request)."""
    generate: Callable[[], dict[str, Any]] = api.openapi

    def openapi() -> dict[str, Any]:
        if api.openapi_schema is None:
            api.openapi_schema = describe(generate(), config)
        return api.openapi_schema

    api.openapi = openapi  # type: ignore[method-assign]
