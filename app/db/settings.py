"""Server-wide values every replica shares, made once and kept in the database."""

from __future__ import annotations

import secrets

from sqlalchemy import insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.schema import settings


async def shared_secret(db: AsyncEngine, key: str) -> str:
    """A random secret stored under `key`: the first replica to ask makes it, the others read it."""
    try:
        async with db.begin() as conn:
            await conn.execute(insert(settings).values(key=key, value=secrets.token_hex(32)))
    except IntegrityError:
        pass
    async with db.connect() as conn:
        return (await conn.execute(select(settings.c.value).where(settings.c.key == key))).scalar_one()
