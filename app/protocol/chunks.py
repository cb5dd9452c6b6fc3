"""ModelInput chunks this server cannot take: its models are text-only, so an image or audio chunk (or any other
non-text one) is a user error naming the chunk's type and position, in forward_backward (proto and JSON) and sample.
"""

from __future__ import annotations

from app.errors import UserError

TEXT = "encoded_text"


def not_text(field: str, kind: object) -> UserError:
    """The error for a chunk of type `kind` at `field` (e.g. ``data[0].model_input[1]``)."""
    return UserError(
        f"{field} is a {kind or 'empty'!r} chunk; this server's models are text-only: send encoded_text chunks "
        "(no images or audio)",
        field=field,
    )
