"""search_checkpoints (SDK 0.39, experimental): a user's checkpoints and the published ones they ask for, newest
first, filtered by project, user_metadata pairs, type and base model, paged by a cursor (app.db.checkpoint_search).
Another user's unpublished checkpoint is never found; theirs published are, with `owner` `accessible` or naming
them."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter

from app.api.deps import ServicesDep, UserDep
from app.api.listing import listed_metadata, metadata_share
from app.api.session_views import cursor_timestamp
from app.db.checkpoint_search import CheckpointQuery
from app.db.checkpoints import KIND_OF_TYPE
from app.errors import UserError
from app.protocol.wire import CheckpointSearchRequest, SearchOwner
from app.storage.paths import parse_tinker_path

router = APIRouter(prefix="/api/v1")


def _owners(owner: SearchOwner | None) -> Literal["own", "accessible"] | tuple[str, ...]:
    if owner is None or owner.type == "own":
        return "own"
    if owner.type == "accessible":
        return "accessible"
    if not owner.owner_urns:
        raise UserError("owner of type 'user' names 1 to 10 users in owner_urns", field="owner.owner_urns")
    return tuple(owner.owner_urns)


def _query(body: CheckpointSearchRequest, user: str, page_limit: int) -> CheckpointQuery:
    if body.limit > page_limit:
        raise UserError(f"limit {body.limit} exceeds limits.max_checkpoint_search_page={page_limit}", field="limit")
    before = None
    if body.cursor is not None:
        path = parse_tinker_path(body.cursor.last_checkpoint_uuid, field="cursor.last_checkpoint_uuid")
        before = (cursor_timestamp(body.cursor.last_created_at), path)
    return CheckpointQuery(
        reader=user,
        owners=_owners(body.owner),
        project_ids=body.project_ids,
        user_metadata=body.user_metadata,
        kind=None if body.checkpoint_type is None else KIND_OF_TYPE[body.checkpoint_type],
        base_models=body.base_models,
        before=before,
    )


@router.post("/checkpoints/search")
async def search_checkpoints(body: CheckpointSearchRequest, services: ServicesDep, user: UserDep) -> dict:
    """search_checkpoints (SDK 0.39): one page of `CheckpointSearchResponse`, `checkpoints` (each a `Checkpoint`
    with its `base_model`; their user_metadata bounded per page as in every listing) and `next_cursor`
    (`last_created_at`, `last_checkpoint_uuid`: the last one's tinker path), null after the last page. `limit` is at
    most `limits.max_checkpoint_search_page`."""
    query = _query(body, user, services.config.limits.max_checkpoint_search_page)
    found, more = await services.checkpoint_search.search(query, body.limit)
    share = metadata_share(services.config.limits.max_listing_metadata_bytes, found)
    views = [{**c.to_json(), **listed_metadata(c.record.user_metadata, share)} for c in found]
    last = views[-1] if more else None  # more: a page of `limit` (at least 1)
    cursor = None if last is None else {"last_created_at": last["time"], "last_checkpoint_uuid": last["tinker_path"]}
    return {"checkpoints": views, "next_cursor": cursor}
