"""The one error mapper (app.api.error_responses) on a real FastAPI app: each error kind gets its status, headers
and body; an internal fault is logged with its request id and answered without its details."""

from __future__ import annotations

import logging

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel

from app.api.error_responses import register_exception_handlers
from app.errors import (
    Gone,
    LimitExceeded,
    NotFound,
    Overloaded,
    Relayed,
    ServerError,
    TinkerServeError,
    Unavailable,
)


class Body(BaseModel):
    seq_id: int


ERRORS: dict[str, TinkerServeError] = {
    "overloaded": Overloaded("queue full", retry_after_s=3, details={"queue_state": "paused_capacity"}),
    "gone": Gone("session ended", field="session_id"),
    "not_found": NotFound("no such future", field="request_id"),
    "unavailable": Unavailable("not ready", details={"trainers": {"t": False}}),
    "limit": LimitExceeded("too many", field="data"),
    "server": ServerError("worker died"),
    "relayed": Relayed(422, {"error": {"message": "vLLM says no", "type": "X", "param": "stop", "code": 422}}),
}


@pytest.fixture(scope="module")
def client() -> TestClient:
    api = FastAPI()
    register_exception_handlers(api)

    @api.get("/raise/{kind}")
    async def raise_(kind: str) -> dict:
        if kind == "bug":
            raise KeyError("secret-internal-detail")
        raise ERRORS[kind]

    @api.post("/validate")
    async def validate(body: Body) -> dict:
        return {"ok": body.seq_id}

    @api.get("/v1/raise/{kind}")  # an OpenAI-compatible route
    async def raise_openai(kind: str) -> dict:
        raise ERRORS[kind]

    @api.post("/v1/validate")
    async def validate_openai(body: Body) -> dict:
        return {"ok": body.seq_id}

    return TestClient(api, raise_server_exceptions=False)


@pytest.mark.parametrize(
    ("kind", "status", "category"),
    [
        ("overloaded", 429, "server"),
        ("gone", 410, "user"),
        ("not_found", 404, "user"),
        ("unavailable", 503, "server"),
        ("limit", 400, "user"),
        ("server", 500, "server"),
    ],
)
def test_each_kind_maps_to_its_status(client: TestClient, kind: str, status: int, category: str) -> None:
    response = client.get(f"/raise/{kind}")
    assert response.status_code == status
    body = response.json()
    assert body["category"] == category and body["error"] == ERRORS[kind].message
    assert body.get("field") == ERRORS[kind].field


def test_overloaded_says_when_to_retry_and_why(client: TestClient) -> None:
    response = client.get("/raise/overloaded")
    assert response.headers["retry-after"] == "3"
    assert response.json()["queue_state"] == "paused_capacity"


def test_unavailable_carries_its_details(client: TestClient) -> None:
    assert client.get("/raise/unavailable").json()["trainers"] == {"t": False}


def test_validation_is_a_user_error_naming_the_field(client: TestClient) -> None:
    response = client.post("/validate", json={"seq_id": "x"})
    assert response.status_code == 400
    assert response.json()["field"] == "seq_id" and response.json()["category"] == "user"


def test_internal_fault_is_logged_with_its_request_id_and_not_leaked(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    logger = logging.getLogger("tinker_serve.api")
    logger.addHandler(caplog.handler)  # the app's loggers may not propagate (deployments.logs)
    try:
        response = client.get("/raise/bug", headers={"x-request-id": "req-123"})
    finally:
        logger.removeHandler(caplog.handler)
    assert response.status_code == 500
    body = response.json()
    assert body["category"] == "server" and body["request_id"] == "req-123"
    assert "secret-internal-detail" not in response.text and "KeyError" in body["error"]
    records = {id(r): r for r in caplog.records if r.name == "tinker_serve.api"}.values()  # once, or also propagated
    assert records and all("req-123" in r.getMessage() and r.exc_info is not None for r in records)


def test_openai_routes_answer_in_openais_shape(client: TestClient) -> None:
    response = client.get("/v1/raise/limit")
    assert response.status_code == 400
    assert response.json() == {
        "error": {"message": "too many", "type": "invalid_request_error", "param": "data", "code": 400}
    }
    assert client.get("/v1/raise/server").json()["error"]["type"] == "server_error"
    invalid = client.post("/v1/validate", json={"seq_id": "x"})
    assert invalid.status_code == 400 and invalid.json()["error"]["param"] == "seq_id"


def test_a_relayed_error_keeps_its_status_and_body(client: TestClient) -> None:
    for path in ("/raise/relayed", "/v1/raise/relayed"):
        response = client.get(path)
        assert response.status_code == 422 and response.json() == ERRORS["relayed"].to_body()
