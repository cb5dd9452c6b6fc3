"""Every path the installed tinker SDK can call has a route here: read from the SDK's own code, so a newer SDK
with a new endpoint fails this test until the server answers it."""

from __future__ import annotations

import re
from pathlib import Path

import tinker
from starlette.routing import Match

from app.api.main import create_api

SDK_ROOT = Path(tinker.__file__).parent
# `client.post("/api/v1/x"`, `self._get(f"/api/v1/{id}"`, and the CLI's `_request("GET", "/api/v1/x"`.
_METHOD_CALL = re.compile(r"\._?(post|get|put|delete|patch)\(\s*f?\"(/api/v1/[^\"]*)\"")
_REQUEST_CALL = re.compile(r"_request\(\s*\"(GET|POST|PUT|DELETE|PATCH)\",\s*f?\"(/api/v1/[^\"]*)\"")
_ANY_PATH = re.compile(r"f?\"(/api/v1/[^\"]*)\"")
_PLACEHOLDER = re.compile(r"\{[^}]*\}")
SAMPLE_ID = "run-1:train:0"  # what a placeholder stands for when a route is matched


def sdk_calls() -> set[tuple[str, str]]:
    """(method, path template with `{}` placeholders) of every API call in the SDK's non-test code."""
    calls: set[tuple[str, str]] = set()
    for source in SDK_ROOT.rglob("*.py"):
        if source.name.endswith("_test.py"):
            continue
        text = source.read_text()
        found = {(m.upper(), p) for m, p in _METHOD_CALL.findall(text)} | set(_REQUEST_CALL.findall(text))
        calls |= {(method, _PLACEHOLDER.sub("{}", path)) for method, path in found}
        for path in _ANY_PATH.findall(text):  # a call written some other way must not slip past
            template = _PLACEHOLDER.sub("{}", path)
            assert any(known == template for _, known in calls), f"{source.name}: cannot tell how {path} is called"
    return calls


def route_of(method: str, template: str) -> str | None:
    path = template.replace("{}", SAMPLE_ID)
    scope = {"type": "http", "method": method, "path": path, "root_path": ""}
    for route in create_api().routes:
        match, _ = route.matches(scope)
        if match == Match.FULL:
            return getattr(route, "path", "?")
    return None


def test_the_sdk_is_read_whole() -> None:
    calls = sdk_calls()
    assert len(calls) >= 40, sorted(calls)  # SDK 0.38 calls 46 (method, path) pairs
    assert ("POST", "/api/v1/forward_backward") in calls
    assert ("PUT", "/api/v1/training_runs/{}/checkpoints/{}/ttl") in calls


def test_every_sdk_call_has_a_route() -> None:
    missing = sorted(f"{method} {path}" for method, path in sdk_calls() if route_of(method, path) is None)
    assert not missing, f"SDK calls without a route: {missing}"
