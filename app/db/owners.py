"""Which sessions a user sees. Every object belongs to a user through its session (models, sampling sessions,
checkpoints, futures, custom losses, stability records and usage all carry or start with their session id), so one
filter on `sessions.owner` scopes every listing. Sessions made before owners were recorded (owner null) are
everyone's."""

from __future__ import annotations

from sqlalchemy import ColumnElement, Select, or_, select

from app.db.schema import sessions, training_runs


def visible_to(user: str) -> ColumnElement[bool]:
    """Sessions `user` may see: their own, and those that predate owners."""
    return or_(sessions.c.owner == user, sessions.c.owner.is_(None))


def session_ids_of(user: str) -> Select:
    """A subquery of the ids of the sessions `user` may see."""
    return select(sessions.c.session_id).where(visible_to(user))


def owned_runs(user: str) -> Select:
    """A subquery of the model ids of the runs in `user`'s own sessions (what their quotas count)."""
    return select(training_runs.c.model_id).where(
        training_runs.c.session_id.in_(select(sessions.c.session_id).where(sessions.c.owner == user))
    )
