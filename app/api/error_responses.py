"""The one mapping from exceptions to HTTP responses, with Tinker's lower-case error categories: our errors carry
their status (and headers), request validation is a user error, and anything else is an internal fault, logged
with its traceback and answered as a server error that names the request id to look it up by."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from app.api.auth import OPENAI_PREFIX  # errors on the OpenAI-compatible routes take OpenAI's shape
from app.errors import TinkerServeError, UserError, anthropic_error

logger = logging.getLogger("tinker_serve.api")


def validation_message(errors: Sequence[Mapping[str, Any]]) -> tuple[str, str]:
    """(message, field) for pydantic errors: every problem listed, the first field named."""
    parts, first = [], ""
    for err in errors:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p not in ("body",))
        first = first or loc
        parts.append(f"{loc or 'body'}: {err.get('msg')}")
    return "; ".join(parts), first


ANTHROPIC_PATH = "/v1/messages"  # and below it: errors in Anthropic's shape


def _is_anthropic(path: str) -> bool:
    return path == ANTHROPIC_PATH or path.startswith(f"{ANTHROPIC_PATH}/")


def _body(path: str, exc: TinkerServeError) -> dict[str, Any]:
    if _is_anthropic(path):
        return exc.to_anthropic_body()
    return exc.to_openai_body() if path.startswith(OPENAI_PREFIX) else exc.to_body()


def error_response(path: str, exc: TinkerServeError, expected: bool = False) -> JSONResponse:
    """The answer to one of our errors on `path` (OpenAI's shape on the OpenAI-compatible routes, Anthropic's on the
    Messages routes). A server error is logged unless `expected` (a part still starting, as /ready reports it)."""
    if exc.status_code >= 500 and not expected:
        logger.error("server error on %s: %s", path, exc.message)
    body = _body(path, exc)
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers())


def register_exception_handlers(app: FastAPI) -> None:
    @app.exception_handler(TinkerServeError)
    async def _known(request: Request, exc: TinkerServeError) -> JSONResponse:
        return error_response(request.url.path, exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, field = validation_message(exc.errors())
        return await _known(request, UserError(message, field=field))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
        logger.exception("internal error on %s (request %s)", request.url.path, request_id)
        message = (
            f"internal server error ({type(exc).__name__}); the server log has the details under request {request_id}"
        )
        if _is_anthropic(request.url.path):
            return JSONResponse(anthropic_error(500, message), status_code=500)
        return JSONResponse({"error": message, "category": "server", "request_id": request_id}, status_code=500)
