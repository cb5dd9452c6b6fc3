"""Reading the ranks' replies to a message of commands: which command failed, and with what error."""

from __future__ import annotations

from typing import Any

from app.messages import CommandError, RankReply, Replies


def first_error(per_rank: list[RankReply]) -> dict[str, Any] | None:
    """The failed-future body of the first rank whose reply to a command is an error, if any."""
    return next((reply.error for reply in per_rank if isinstance(reply, CommandError)), None)


def first_failed_command(replies: Replies) -> tuple[int, dict[str, Any]] | None:
    """(index, error body) of the first of a message's commands some rank failed; `replies[rank][command]`."""
    for i in range(len(replies[0]) if replies else 0):
        error = first_error([rank_replies[i] for rank_replies in replies])
        if error is not None:
            return i, error
    return None
