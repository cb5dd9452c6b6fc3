"""Adapters being uploaded (app.api.uploads): who started each, what it must match, and the bytes it holds of its
owner's checkpoint quota until it is finished or expires."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Row, delete, insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql.elements import ColumnElement

from app.db.schema import external_uploads


@dataclass(frozen=True)
class Upload:
    upload_id: str
    owner: str
    base_model: str
    spec: dict  # the AdapterSpec's fields
    project_id: str | None
    files: dict[str, int]  # file name -> the most bytes it may hold
    reserved_bytes: int
    expires_at: float
    tinker_path: str | None  # the checkpoint it made; None: unfinished

    @property
    def location(self) -> str:
        """Where its files are stored while it is unfinished."""
        return f"uploads/{self.upload_id}"


def _by_id(upload_id: str) -> ColumnElement[bool]:
    return external_uploads.c.upload_id == upload_id


def _upload(row: Row[Any]) -> Upload:
    return Upload(
        row.upload_id,
        row.owner,
        row.base_model,
        row.spec,
        row.project_id,
        row.files,
        row.reserved_bytes,
        row.expires_at,
        row.tinker_path,
    )


class UploadStore:
    def __init__(self, db: AsyncEngine) -> None:
        self._db = db
        self.admission = asyncio.Lock()  # one start at a time per replica: each sees the bytes those before it hold
        self.finishing = asyncio.Lock()  # one finish at a time per replica: a retry never makes a second checkpoint

    async def add(self, upload: Upload) -> None:
        async with self._db.begin() as conn:
            await conn.execute(
                insert(external_uploads).values(
                    upload_id=upload.upload_id,
                    owner=upload.owner,
                    base_model=upload.base_model,
                    spec=upload.spec,
                    project_id=upload.project_id,
                    files=upload.files,
                    reserved_bytes=upload.reserved_bytes,
                    created_at=time.time(),
                    expires_at=upload.expires_at,
                )
            )

    async def find(self, upload_id: str) -> Upload | None:
        async with self._db.connect() as conn:
            row = (await conn.execute(select(external_uploads).where(_by_id(upload_id)))).first()
        return None if row is None else _upload(row)

    async def finish(self, upload_id: str, tinker_path: str) -> None:
        async with self._db.begin() as conn:
            await conn.execute(update(external_uploads).where(_by_id(upload_id)).values(tinker_path=tinker_path))

    async def expired(self, now: float) -> list[Upload]:
        """Uploads past their expiry (finished ones too: their rows are no longer needed)."""
        async with self._db.connect() as conn:
            rows = (await conn.execute(select(external_uploads).where(external_uploads.c.expires_at <= now))).all()
        return [_upload(row) for row in rows]

    async def remove(self, upload_id: str) -> None:
        async with self._db.begin() as conn:
            await conn.execute(delete(external_uploads).where(_by_id(upload_id)))
