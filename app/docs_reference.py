"""The docs site's generated reference pages (docs/hooks.py fills them at build time): the configuration, from the
config models' fields and their descriptions, and the HTTP API, from the app's own OpenAPI document. So the
reference cannot drift from the code: a field or route added is documented by the next build."""

from __future__ import annotations

import json
import re
import typing
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from app.config import ServerConfig

EXAMPLE_BASE_MODEL = {"name": "tinker-serve/tiny", "path": "models/tiny", "embedded_preset": "tiny"}


def config_sections(model: type[BaseModel] = ServerConfig, prefix: str = "") -> Iterator[tuple[str, type[BaseModel]]]:
    """(dotted path, model) of the config and every section inside it, depth first (a list's items as `name[]`)."""
    yield prefix, model
    for name, field in model.model_fields.items():
        for inner in _models_in(field.annotation):
            path = f"{prefix}.{name}" if prefix else name
            yield from config_sections(inner, f"{path}[]" if _is_list(field.annotation) else path)


def undocumented_fields() -> list[str]:
    """The config fields that have no description (the reference would show them blank)."""
    return [
        f"{path}.{name}" if path else name
        for path, model in config_sections()
        for name, field in model.model_fields.items()
        if not (field.description or "").strip()
    ]


def configuration_markdown() -> str:
    """Every section of the configuration as a table: key, type, default, what it does."""
    parts = []
    for path, model in config_sections():
        title = f"`{path}`" if path else "Top level"
        doc = (model.__doc__ or "").strip().replace("\n", " ")
        rows = ["| key | type | default | description |", "|---|---|---|---|"]
        for name, field in model.model_fields.items():
            rows.append(f"| `{name}` | {_type(field)} | {_default(field)} | {_cell(field.description or '')} |")
        parts.append(f"## {title}\n\n{doc}\n\n" + "\n".join(rows))
    return "\n\n".join(parts) + "\n"


def http_api_markdown() -> str:
    """Every route of the app's OpenAPI document, by area: method, path, what it does (its handler's docstring, else
    its name) and its JSON body's schema."""
    from app.api.main import create_api
    from app.api.openapi import install

    api = create_api()
    install(api, ServerConfig(base_models=[EXAMPLE_BASE_MODEL]))
    schema = api.openapi()
    by_area: dict[str, list[str]] = {}
    for path, operations in schema["paths"].items():
        for method, op in operations.items():
            text = (op.get("description") or "").split("\n\n")[0] or op.get("summary", "")
            body = _body_schema(op)
            by_area.setdefault(_area(path), []).append(
                f"| `{method.upper()}` | `{path}` | {_cell(text)} | {f'`{body}`' if body else ''} |"
            )
    parts = [
        f"## {area}\n\n| method | path | what it does | body |\n|---|---|---|---|\n" + "\n".join(rows)
        for area, rows in by_area.items()
    ]
    return f"{len(schema['paths'])} paths (OpenAPI {schema['openapi']}).\n\n" + "\n\n".join(parts) + "\n"


def _area(path: str) -> str:
    if path.startswith("/v1/messages"):
        return "Anthropic-compatible"
    if path.startswith("/v1/"):
        return "OpenAI-compatible"
    if path.startswith(("/api/v1/admin", "/api/v1/audit", "/api/v1/auth")):
        return "Users, keys and audit"
    if path.startswith("/api/v1/"):
        return "Tinker API"
    return "Health, console and downloads"


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _is_list(annotation: Any) -> bool:
    return typing.get_origin(annotation) is list


def _type(field: FieldInfo) -> str:
    text = str(field.annotation).replace("typing.", "").replace("app.config_sections.", "").replace("app.config.", "")
    return _code(text.replace("<class '", "").replace("'>", ""))


def _default(field: FieldInfo) -> str:
    if field.default is PydanticUndefined and field.default_factory is None:
        return "required"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "(section)"
    return _code(json.dumps(value, default=str))


# The tables are rendered by Python-Markdown's tables extension (MkDocs): a `|` inside a code span does not split the
# cell, and there a backslash is kept as written (`str \| None` would show its backslash); outside code spans a bare
# `|` splits the cell and `\|` is the escaped pipe.
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def _code(text: str) -> str:
    """`text` as a table cell's code span, its pipes as they are (fenced longer than any backtick run in it)."""
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    padding = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{padding}{text}{padding}{fence}"


def _cell(text: str) -> str:
    """Prose as one table cell: on one line, its pipes escaped outside code spans (inside them they stay)."""
    text = " ".join(text.split())
    out, last = [], 0
    for span in _CODE_SPAN.finditer(text):
        out += [text[last : span.start()].replace("|", "\\|"), span[0]]
        last = span.end()
    return "".join([*out, text[last:].replace("|", "\\|")])


def _body_schema(op: dict[str, Any]) -> str:
    content = op.get("requestBody", {}).get("content", {})
    for media in content.values():
        ref = media.get("schema", {}).get("$ref", "")
        if ref:
            return str(ref.rsplit("/", 1)[-1])
    return ", ".join(content) if content else ""
