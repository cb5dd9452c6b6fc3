"""The error hierarchy raised by app/: user errors (4xx, category "user") and server errors (429 and 5xx).

Routers raise these and never write an HTTP status themselves; app.api.error_responses maps each to its response.
Anything else that escapes a request is an internal fault: logged, and answered as a server error.
"""

from __future__ import annotations

from typing import Any

# Anthropic's error types by HTTP status (https://docs.anthropic.com/en/api/errors); others by class (4xx or 5xx)
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
}


def anthropic_error(status_code: int, message: str) -> dict[str, Any]:
    """An error body in Anthropic's shape (the /v1/messages routes) for `status_code`."""
    kind = _ANTHROPIC_TYPES.get(status_code, "invalid_request_error" if status_code < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


class TinkerServeError(Exception):
    """Base of every error this project raises on purpose."""

    status_code: int = 500
    category: str = "server"

    def __init__(self, message: str, *, field: str | None = None, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.details = details or {}  # more keys of the body

    def to_body(self) -> dict[str, Any]:
        """JSON body for an HTTP error or a failed future (lower-case category, as the SDK expects)."""
        body: dict[str, Any] = {"error": self.message, "category": self.category}
        if self.field:
            body["field"] = self.field
        return {**body, **self.details}

    def to_openai_body(self) -> dict[str, Any]:
        """The same error in OpenAI's shape (the /v1/ routes), `param` naming the field."""
        kind = "server_error" if self.status_code >= 500 else "invalid_request_error"
        return {"error": {"message": self.message, "type": kind, "param": self.field, "code": self.status_code}}

    def to_anthropic_body(self) -> dict[str, Any]:
        """The same error in Anthropic's shape (the /v1/messages routes), which has no field of its own for the
        request field: the message names it."""
        named = not self.field or self.field in self.message
        return anthropic_error(self.status_code, self.message if named else f"{self.field}: {self.message}")

    def headers(self) -> dict[str, str]:
        """HTTP headers of the error response."""
        return {}


class UserError(TinkerServeError):
    """The request is wrong; retrying it unchanged cannot help."""

    status_code = 400
    category = "user"


class LimitExceeded(UserError):
    """A configured limit was exceeded; `field` names the offending request field."""


class BodyTooLarge(LimitExceeded):
    """A request body over its route's byte limit (refused before it is read)."""

    status_code = 413


class NotFound(UserError):
    status_code = 404


class Gone(UserError):
    """The object existed and has ended (a finished or expired session)."""

    status_code = 410


class Unauthorized(UserError):
    status_code = 401


class InvalidToken(Unauthorized):
    """A JWT that is forged, malformed or expired: the SDK exchanges its key for a new one and replays the call."""

    def headers(self) -> dict[str, str]:
        return {"www-authenticate": 'Bearer error="invalid_token"'}


class Forbidden(UserError):
    status_code = 403


class TooLargeForWorkers(UserError):
    """The operation was running each time the training workers died (killed for memory, most likely), as often as
    timeouts.max_worker_deaths_per_operation allows: it is not run again, since unchanged it would kill them again."""


class Relayed(TinkerServeError):
    """An error answer made elsewhere (vLLM's OpenAI layer), passed on with its status and body."""

    def __init__(self, status_code: int, body: dict[str, Any]) -> None:
        super().__init__(str(body))
        self.status_code = status_code
        self.category = "user" if status_code < 500 else "server"
        self.body = body

    def to_body(self) -> dict[str, Any]:
        return self.body

    def to_openai_body(self) -> dict[str, Any]:
        return self.body

    def to_anthropic_body(self) -> dict[str, Any]:
        """The relayed body (OpenAI's shape, as vLLM's serving layer answers) in Anthropic's."""
        error = self.body.get("error")
        message = error.get("message") if isinstance(error, dict) else None
        return anthropic_error(self.status_code, message if isinstance(message, str) else str(self.body))


class ServerError(TinkerServeError):
    """Something failed on our side (worker died, storage failed)."""


class Overloaded(TinkerServeError):
    """Too much work is queued; the same request can succeed after `retry_after_s`."""

    status_code = 429

    def __init__(self, message: str, *, retry_after_s: int = 1, details: dict[str, Any] | None = None) -> None:
        super().__init__(message, details=details)
        self.retry_after_s = retry_after_s

    def headers(self) -> dict[str, str]:
        return {"retry-after": str(self.retry_after_s)}


class Unavailable(ServerError):
    """A part of the server is not ready (yet)."""

    status_code = 503


class GroupRestarted(ServerError):
    """The worker group restarted while the command was in flight; the models it held in memory are gone.
    `running`: the request ids of the commands the ranks were running then (taken, not answered), which may be what
    killed them. An instance attribute, not a class one: Ray's wrapper of a remote error finds it on the cause."""

    def __init__(self, message: str, *, running: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.running = running


def require(condition: bool, message: str, *, field: str | None = None) -> None:
    """Raise a UserError naming `field` unless `condition` holds."""
    if not condition:
        raise UserError(message, field=field)
