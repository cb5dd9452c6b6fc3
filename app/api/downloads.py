"""Downloading exports: signed per-file URLs (external_weights_urls) and the route that streams the files.

URLs carry an HMAC signature and an expiry instead of an API key (the CLI fetches them with plain urllib),
signed with a key every ingress replica shares through the database. Files stream from storage in chunks;
a checkpoint is never read whole into memory.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Literal
from urllib.parse import quote

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse
from pyarrow import NativeFile

from app.api.deps import ServicesDep
from app.api.signatures import sign, signature_valid
from app.db.checkpoints import CheckpointRecord
from app.errors import Forbidden, NotFound
from app.storage.objects import StoredFile
from app.storage.paths import checkpoint_path

router = APIRouter(prefix="/api/v1")
DOWNLOAD_PREFIX = "/api/v1/downloads/"  # no API key: the signature authorises
_CHUNK = 1 << 20


def signed_urls(
    base_url: str, key: str, record: CheckpointRecord, files: list[StoredFile], ttl_s: int, *, owner: bool
) -> tuple[dict[str, str], datetime]:
    """A download URL per file of an external-weights checkpoint, valid for `ttl_s`; and when they expire. URLs
    given to another user than the checkpoint's `owner` say so, and stop working once it is unpublished."""
    expires = int(time.time()) + ttl_s
    urls = {}
    for f in files:
        resource = f"{record.path.model_id}/{record.path.name}/{f.relative_path}"
        grant = "" if owner else "&grant=public"
        urls[f.relative_path] = (
            f"{base_url.rstrip('/')}{DOWNLOAD_PREFIX}{quote(resource)}"
            f"?expires={expires}{grant}&signature={sign(key, _granted(resource, owner), expires)}"
        )
    return urls, datetime.fromtimestamp(expires, UTC)


def _granted(resource: str, owner: bool) -> str:
    """What a URL's signature covers: the file, and for another user's URL that it holds while published."""
    return resource if owner else f"{resource}\npublic"


async def _chunks(stream: NativeFile) -> AsyncIterator[bytes]:
    try:
        while chunk := await asyncio.to_thread(stream.read, _CHUNK):
            yield chunk
    finally:
        stream.close()


@router.get("/downloads/{model_id}/{name}/{file_path:path}")
async def download(
    model_id: str,
    name: str,
    file_path: str,
    services: ServicesDep,
    expires: int = Query(...),
    signature: str = Query(...),
    grant: Literal["owner", "public"] = Query("owner"),
) -> StreamingResponse:
    resource, owner = f"{model_id}/{name}/{file_path}", grant == "owner"
    if not signature_valid(services.url_signing_key, _granted(resource, owner), expires, signature):
        raise Forbidden(
            "this download link is not valid; get fresh links with external_weights_urls", field="signature"
        )
    if time.time() > expires:
        raise Forbidden("this download link expired; get fresh links with external_weights_urls", field="expires")
    record = await services.checkpoints.get(checkpoint_path(model_id, "external_weights", name), field="name")
    if not owner and not record.public:
        raise Forbidden("this checkpoint is no longer published; ask its owner", field="grant")
    files = {f.relative_path: f for f in await asyncio.to_thread(services.storage.files, record.location)}
    if file_path not in files:
        raise NotFound(f"{record.path.uri!r} has no file {file_path!r}", field="file_path")
    stream = await asyncio.to_thread(services.storage.open, record.location, file_path)
    return StreamingResponse(
        _chunks(stream),
        media_type="application/octet-stream",
        headers={"content-length": str(files[file_path].size_bytes)},
    )
