"""One mapping from exceptions to HTTP responses with Tinker's lower-case error categories."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from app.errors import TinkerServeError

logger = logging.getLogger("tinker_serve.api")


def validation_message(errors: list[dict]) -> tuple[str, str]:
    """(message, field) for pydantic errors: every problem listed, the first field named."""
    parts, first = [], ""
    for err in errors:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p not in ("body",))
        first = first or loc
        parts.append(f"{loc or 'body'}: {err.get('msg')}")
    return "; ".join(parts), first


def register_exception_handlers(app: FastAPI) -> None:
    @app.exception_handler(TinkerServeError)
    async def _known(_: Request, exc: TinkerServeError) -> JSONResponse:
        if exc.status_code >= 500:
            logger.error("server error: %s", exc.message)
        return JSONResponse(exc.to_body(), status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, field = validation_message(exc.errors())
        return JSONResponse({"error": message, "category": "user", "field": field}, status_code=400)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error")
        return JSONResponse({"error": f"internal error: {exc!r}", "category": "server"}, status_code=500)
