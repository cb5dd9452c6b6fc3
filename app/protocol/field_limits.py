"""Bounds of request fields that come from the configuration (`limits`), checked while a request body is validated:
`Annotated[list[str], Limit("max_stop_sequences", "items")]`. A body over one fails validation naming its field
(a 400 with `field`), before any handler builds anything from it.

The limits in force are the serving app's (`limits_in_force`, set per request by app.api.limits_context); outside a
request, the defaults.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import GetCoreSchemaHandler
from pydantic_core import PydanticCustomError, core_schema

from app.config_sections import LimitsConfig

# items: a list's or map's entries; chars: a string's characters; total_chars: the characters of a string or of all
# the strings of a list; json_bytes: the value as JSON (sizes everything inside); words: a string's whitespace-separated
# words (a count, not a size: pair it with a length bound)
Measure = Literal["items", "chars", "total_chars", "json_bytes", "words"]
SIZES_CONTENTS: frozenset[Measure] = frozenset({"total_chars", "json_bytes"})  # bounds what a container holds too

_DEFAULTS = LimitsConfig()
_limits: ContextVar[LimitsConfig | None] = ContextVar("limits", default=None)


@contextmanager
def limits_in_force(limits: LimitsConfig) -> Iterator[None]:
    """Validate request bodies against `limits` within this block."""
    token = _limits.set(limits)
    try:
        yield
    finally:
        _limits.reset(token)


def _measure(value: Any, measure: Measure) -> int:
    if measure == "items":
        return len(value) if isinstance(value, (list, dict)) else 0
    if measure == "chars":
        return len(value) if isinstance(value, str) else 0
    if measure == "total_chars":
        strings = [value] if isinstance(value, str) else value if isinstance(value, list) else []
        return sum(len(s) for s in strings if isinstance(s, str))
    if measure == "words":
        return len(value.split()) if isinstance(value, str) else 0
    return len(json.dumps(value).encode())


@dataclass(frozen=True)
class Limit:
    """Field metadata: the field's `measure` may not exceed `limits.<name>` (or a fixed number, with its reason in a
    comment where it is used)."""

    bound: str | int
    measure: Measure

    def __post_init__(self) -> None:
        if isinstance(self.bound, str) and self.bound not in LimitsConfig.model_fields:
            raise ValueError(f"Limit names {self.bound!r}, which is not a field of LimitsConfig")

    def value(self, limits: LimitsConfig) -> int:
        return getattr(limits, self.bound) if isinstance(self.bound, str) else self.bound

    def check(self, value: Any) -> Any:
        allowed, size = self.value(_limits.get() or _DEFAULTS), _measure(value, self.measure)
        if size > allowed:
            name = f"limits.{self.bound}={allowed}" if isinstance(self.bound, str) else f"the protocol's {allowed}"
            raise PydanticCustomError(
                "limit_exceeded",
                "{size} {unit} exceed {name}",
                {"size": size, "unit": self.measure.replace("_", " "), "name": name},
            )
        return value

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self.check, handler(source))
