"""The serving app's `limits` in force while each request's body is validated (app.protocol.field_limits)."""

from __future__ import annotations

from app.api.gate import ASGIApp, Receive, Scope, Send
from app.protocol.field_limits import limits_in_force


class LimitsContext:
    """ASGI middleware: validation within a request reads the limits of the app's services."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        services = getattr(scope["app"].state, "services", None) if "app" in scope else None
        if services is None:
            await self.app(scope, receive, send)
            return
        with limits_in_force(services.config.limits):
            await self.app(scope, receive, send)
