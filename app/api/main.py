"""The FastAPI application: every router of the Tinker API, auth, and error mapping."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from app.api import (
    admin,
    anthropic,
    apikeys,
    audit,
    capacity,
    checkpoint_search,
    checkpoints,
    copies,
    custom_losses,
    downloads,
    futures,
    hub,
    models,
    openai,
    rest,
    sampling,
    service,
    session_views,
    traces,
    training,
    uploads,
    usage,
)
from app.api.error_responses import error_response, register_exception_handlers
from app.api.gate import RequestGate
from app.api.limits_context import LimitsContext
from app.console import install as install_console
from app.errors import Unavailable


def create_api() -> FastAPI:
    """Routes only; the owner sets `app.state.services` before serving."""
    api = FastAPI(title="tinker-serve", description="Tinker training API on Ray Serve")
    for router in (
        service.router,
        apikeys.router,
        admin.router,
        audit.router,
        models.router,
        training.router,
        custom_losses.router,
        checkpoints.router,
        sampling.router,
        futures.router,
        rest.router,
        checkpoint_search.router,
        session_views.router,
        traces.router,
        copies.router,
        uploads.router,
        usage.router,
        downloads.router,
        hub.router,
        openai.router,
        anthropic.router,
        capacity.router,
    ):
        api.include_router(router)
    register_exception_handlers(api)
    api.add_middleware(LimitsContext)  # request bodies are validated against the app's limits
    api.add_middleware(RequestGate)  # before routing: Host/Origin, key, rate, body size (app.api.gate)
    install_console(api)

    @api.get("/ready", response_model=None)
    async def ready(request: Request) -> dict | JSONResponse:
        """200 once every trainer and sampler answers; 503 naming those that do not yet (a normal start: not logged
        as an error), or saying why a sampler could not start (`failed`: logged)."""
        services = request.app.state.services
        status = {"trainers": await services.trainers.ready(), "samplers": await services.samplers.ready()}
        if all(all(part.values()) for part in status.values()):
            return status
        failed = await services.samplers.start_failures()
        if failed:
            reasons = "; ".join(failed.values())
            return error_response(request.url.path, Unavailable(reasons, details={**status, "failed": failed}))
        starting = Unavailable("not every trainer and sampler answers yet", details=status)
        return error_response(request.url.path, starting, expected=True)

    return api
