"""The web console: one static page at /console (sessions, runs with live loss curves, checkpoints, server
status) that calls the REST API with the key the user enters, sent as X-API-Key and kept in sessionStorage.
The page and its files hold no data, so they are served without a key (app.api.auth.OPEN_PATHS)."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).parent / "static"
PREFIX = "/console"
# the page runs only its own files (no inline script: injected markup cannot run) and sends no referrer
_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


def install(api: FastAPI) -> None:
    """Serve the console's page at /console and its scripts and styles under /console/static/."""

    @api.get(PREFIX, include_in_schema=False)
    async def console() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers=_HEADERS)

    api.mount(f"{PREFIX}/static", StaticFiles(directory=STATIC), name="console-static")
