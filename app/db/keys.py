"""API keys and the users they belong to. A key is stored only as the SHA-256 of its secret, with a name, owner,
creation, last-use and expiry times and, once revoked, when. Issued keys (`tinker-serve keys create`) belong to a
named user; on loopback in the laptop default any other `tml-` key is enrolled on first use as a user of its own."""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from dataclasses import dataclass

from sqlalchemy import Row, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.schema import api_keys, users
from app.errors import NotFound, UserError

KEY_PREFIX = "tml-"
USER_NAME = re.compile(r"^[a-z][a-z0-9_.@-]{0,63}$")
ENROLLED_PREFIX = "user-"  # the owner id of keys enrolled on first use; no named user may start with it
DAY_S = 86_400


def expiry_after_days(days: float | None) -> float | None:
    """When a key issued now for `days` expires (None: never)."""
    return None if days is None else time.time() + days * DAY_S


def key_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def enrolled_owner(secret: str) -> str:
    """The user an unissued key stands for: `user-` and 16 hex digits of its SHA-256 (the id reveals no key)."""
    return ENROLLED_PREFIX + key_hash(secret)[:16]


@dataclass(frozen=True)
class KeyRecord:
    key_id: int
    owner: str
    name: str
    hint: str
    origin: str
    created_at: float
    last_used_at: float | None
    expires_at: float | None
    revoked_at: float | None

    def usable(self, now: float) -> bool:
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)


def _record(row: Row) -> KeyRecord:
    return KeyRecord(
        row.key_id,
        row.owner,
        row.name,
        row.hint,
        row.origin,
        row.created_at,
        row.last_used_at,
        row.expires_at,
        row.revoked_at,
    )


def check_user_name(name: str) -> str:
    if not USER_NAME.match(name) or name.startswith(ENROLLED_PREFIX):
        raise UserError(
            f"user name {name!r}: use 1-64 lower-case letters, digits and _.@- starting with a letter, not "
            f"starting with {ENROLLED_PREFIX!r}",
            field="user",
        )
    return name


class KeyStore:
    def __init__(self, db: AsyncEngine) -> None:
        self._db = db

    async def issue(self, user: str, name: str, expires_at: float | None = None) -> tuple[str, KeyRecord]:
        """A new key for `user` (made a user if new): the secret, to show once, and its record."""
        check_user_name(user)
        secret = KEY_PREFIX + secrets.token_urlsafe(32)
        now = time.time()
        async with self._db.begin() as conn:
            if await conn.scalar(select(users.c.name).where(users.c.name == user)) is None:
                await conn.execute(insert(users).values(name=user, created_at=now))
            await conn.execute(
                insert(api_keys).values(
                    key_hash=key_hash(secret),
                    owner=user,
                    name=name,
                    hint=secret[-4:],
                    origin="issued",
                    created_at=now,
                    expires_at=expires_at,
                )
            )
        record = await self.find(secret)
        assert record is not None
        return secret, record

    async def find(self, secret: str) -> KeyRecord | None:
        async with self._db.connect() as conn:
            row = (await conn.execute(select(api_keys).where(api_keys.c.key_hash == key_hash(secret)))).first()
        return None if row is None else _record(row)

    async def hashes(self) -> set[str]:
        """The hash of every key, revoked and expired ones included (app.api.key_index keeps them per replica)."""
        async with self._db.connect() as conn:
            return set((await conn.execute(select(api_keys.c.key_hash))).scalars())

    async def by_id(self, key_id: int) -> KeyRecord | None:
        async with self._db.connect() as conn:
            row = (await conn.execute(select(api_keys).where(api_keys.c.key_id == key_id))).first()
        return None if row is None else _record(row)

    async def enroll(self, secret: str, origin: str) -> KeyRecord:
        """The record of a key accepted without being issued (a `tml-` key on loopback, or one configured by the
        operator), made on its first use as a user of its own."""
        try:
            async with self._db.begin() as conn:
                await conn.execute(
                    insert(api_keys).values(
                        key_hash=key_hash(secret),
                        owner=enrolled_owner(secret),
                        name=f"{origin} key",
                        hint=secret[-4:],
                        origin=origin,
                        created_at=time.time(),
                    )
                )
        except IntegrityError:  # enrolled by another request or replica first
            pass
        record = await self.find(secret)
        assert record is not None
        return record

    async def touch(self, key_id: int, now: float) -> None:
        async with self._db.begin() as conn:
            await conn.execute(update(api_keys).where(api_keys.c.key_id == key_id).values(last_used_at=now))

    async def revoke(self, key_id: int, owner: str | None = None) -> KeyRecord:
        """Revoke a key (of `owner`, when given); NotFound when there is none."""
        condition = api_keys.c.key_id == key_id
        if owner is not None:
            condition &= api_keys.c.owner == owner
        async with self._db.begin() as conn:
            await conn.execute(
                update(api_keys).where(condition, api_keys.c.revoked_at.is_(None)).values(revoked_at=time.time())
            )
            row = (await conn.execute(select(api_keys).where(condition))).first()
        if row is None:
            raise NotFound(f"no API key with key_id {key_id}", field="key_id")
        return _record(row)

    async def keys_of(self, owner: str | None = None) -> list[KeyRecord]:
        """Every key (of `owner`, when given), oldest first."""
        query = select(api_keys).order_by(api_keys.c.key_id)
        if owner is not None:
            query = query.where(api_keys.c.owner == owner)
        async with self._db.connect() as conn:
            return [_record(row) for row in await conn.execute(query)]

    async def users(self) -> list[tuple[str, float, int]]:
        """(name, created_at, live keys) of every named user."""
        now = time.time()
        async with self._db.connect() as conn:
            names = (await conn.execute(select(users).order_by(users.c.name))).all()
            keys = [_record(row) for row in await conn.execute(select(api_keys))]
        return [(u.name, u.created_at, sum(k.owner == u.name and k.usable(now) for k in keys)) for u in names]
