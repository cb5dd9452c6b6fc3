"""The FastAPI application: every router of the Tinker API, auth, and error mapping."""

from __future__ import annotations

from fastapi import Depends, FastAPI, Request

from app.api import (
    admin,
    apikeys,
    audit,
    capacity,
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
    usage,
)
from app.api.errors import register_exception_handlers
from app.api.quotas import check_request_rate
from app.console import install as install_console
from app.errors import Unavailable


async def authenticate(request: Request) -> None:
    """Every route's first dependency (cheaper than an HTTP middleware on each request): the caller's key record
    goes to `request.state.key` and its user to `request.state.user` (app.api.deps.UserDep); both None on routes
    that need no key."""
    services = request.app.state.services
    record = await services.auth.authenticate(request)
    if record is not None:
        check_request_rate(services, record.key_id)
    request.state.key = record
    request.state.user = record.owner if record is not None else None


def create_api() -> FastAPI:
    """Routes only; the owner sets `app.state.services` before serving."""
    api = FastAPI(
        title="tinker-serve", description="Tinker training API on Ray Serve", dependencies=[Depends(authenticate)]
    )
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
        session_views.router,
        traces.router,
        copies.router,
        usage.router,
        downloads.router,
        hub.router,
        openai.router,
        capacity.router,
    ):
        api.include_router(router)
    register_exception_handlers(api)
    install_console(api)

    @api.get("/ready")
    async def ready(request: Request) -> dict:
        services = request.app.state.services
        status = {"trainers": await services.trainers.ready(), "samplers": await services.samplers.ready()}
        if not all(all(part.values()) for part in status.values()):
            raise Unavailable("not every trainer and sampler answers yet", details=status)
        return status

    return api
