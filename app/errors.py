"""The error hierarchy raised by app/: user errors (4xx, category "user") and server errors (5xx)."""

from __future__ import annotations


class TinkerServeError(Exception):
    """Base of every error this project raises on purpose."""

    status_code: int = 500
    category: str = "server"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field

    def to_body(self) -> dict[str, str]:
        """JSON body for an HTTP error or a failed future (lower-case category, as the SDK expects)."""
        body = {"error": self.message, "category": self.category}
        if self.field:
            body["field"] = self.field
        return body


class UserError(TinkerServeError):
    """The request is wrong; retrying it unchanged cannot help."""

    status_code = 400
    category = "user"


class LimitExceeded(UserError):
    """A configured limit was exceeded; `field` names the offending request field."""


class NotFound(UserError):
    status_code = 404


class Unauthorized(UserError):
    status_code = 401


class Forbidden(UserError):
    status_code = 403


class ServerError(TinkerServeError):
    """Something failed on our side (worker died, storage failed)."""


class GroupRestarted(ServerError):
    """The worker group restarted while the command was in flight; its state rolled back to the last snapshot."""


def require(condition: bool, message: str, *, field: str | None = None) -> None:
    """Raise a UserError naming `field` unless `condition` holds."""
    if not condition:
        raise UserError(message, field=field)
