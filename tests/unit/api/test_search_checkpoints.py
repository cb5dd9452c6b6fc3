"""search_checkpoints and Checkpoint.base_model over HTTP, on the in-process API (SQLite), driven as SDK 0.39 drives
them: its CheckpointSearchRequest and CheckpointSearchResponse (not installable here) rebuilt from its API reference
on the installed SDK's own bases (StrictBase, SearchOwner), sent as its RestClient sends a search
(`POST /api/v1/checkpoints/search`, `model_dump(mode="json", exclude_none=True)`), pages followed with `next_cursor`.
Bad filters and cursors are 400s naming the field; get_server_capabilities names the SDK range served."""

from __future__ import annotations

import time
from collections.abc import Callable

from pydantic import AwareDatetime, Field
from tinker._compat import model_dump
from tinker._models import BaseModel, StrictBase
from tinker.types import (
    AccessibleSearchOwner,
    Checkpoint,
    CheckpointType,
    GetServerCapabilitiesResponse,
    OwnSearchOwner,
    SearchOwner,
    UserSearchOwner,
)

from app.db.checkpoints import CheckpointRecord
from app.db.metadata import TrainingRun, model_id_for
from app.storage.paths import CheckpointPath
from tests.unit.api.conftest import BASE_MODEL, InProcessApi, new_session
from tests.unit.api.test_hostile_inputs import refused

SEARCH = "/api/v1/checkpoints/search"


class CheckpointSearchCursor(BaseModel):
    last_created_at: AwareDatetime
    last_checkpoint_uuid: str


class CheckpointSearchRequest(StrictBase):
    project_ids: list[str] | None = None
    user_metadata: dict[str, str] = Field(default_factory=dict)
    checkpoint_type: CheckpointType | None = None
    owner: SearchOwner = OwnSearchOwner()
    base_models: list[str] | None = None
    limit: int = Field(default=50, ge=1, le=200)
    cursor: CheckpointSearchCursor | None = None


class Checkpoint039(Checkpoint):
    base_model: str | None = None


class CheckpointSearchResponse(BaseModel):
    checkpoints: list[Checkpoint039]
    next_cursor: CheckpointSearchCursor | None = None


def _run(api: InProcessApi, user: str) -> str:
    session_id = new_session(api, user)
    model_id = model_id_for(session_id, 0)
    run = TrainingRun(model_id, session_id, BASE_MODEL, 4, "policy", BASE_MODEL, {"rank": 4}, {}, time.time(), True)
    api.run(api.services.metadata.add_training_run(run))
    return model_id


def _save(api: InProcessApi, model_id: str, name: str, at: float, **fields: object) -> str:
    kind = str(fields.pop("kind", "weights"))
    path = CheckpointPath(model_id, kind, name)
    record = CheckpointRecord(path, path.new_location(), 10, at, **fields)  # type: ignore[arg-type]
    api.run(api.services.checkpoints.commit(record, overwrite=False))
    return path.uri


def _search(api: InProcessApi, request: CheckpointSearchRequest, user: str = "alice") -> CheckpointSearchResponse:
    response = api.post(SEARCH, model_dump(request, mode="json", exclude_none=True), user)
    assert response.status_code == 200, response.text
    return CheckpointSearchResponse.model_validate(response.json())


def _paths(page: CheckpointSearchResponse) -> list[str]:
    return [c.tinker_path for c in page.checkpoints]


def test_the_sdk_039_search_pages_newest_first(api: InProcessApi) -> None:
    """Three of five checkpoints saved at the same instant: pages of two, each followed by the cursor the SDK
    returns (its datetime re-serialized by pydantic), visit every one once; filters narrow it."""
    model_id, now = _run(api, "alice"), time.time()
    at = [now - 9, now - 5.123456789, now - 5.123456789, now - 5.123456789, now - 1]
    saved = [
        _save(api, model_id, f"c{i}", t, kind="sampler_weights" if i % 2 else "weights", user_metadata={"i": str(i)})
        for i, t in enumerate(at)
    ]
    request = CheckpointSearchRequest(limit=2)
    pages = [_search(api, request)]
    while pages[-1].next_cursor is not None:
        assert pages[-1].next_cursor.last_checkpoint_uuid == pages[-1].checkpoints[-1].tinker_path
        request = request.model_copy(update={"cursor": pages[-1].next_cursor})
        pages.append(_search(api, request))
    assert [len(p.checkpoints) for p in pages] == [2, 2, 1]
    walked = [path for page in pages for path in _paths(page)]
    assert walked[0] == saved[4] and walked[-1] == saved[0] and sorted(walked) == sorted(saved)
    assert {c.base_model for p in pages for c in p.checkpoints} == {BASE_MODEL}

    sampler = _search(api, CheckpointSearchRequest(checkpoint_type="sampler", user_metadata={"i": "3"}))
    assert _paths(sampler) == [saved[3]] and sampler.next_cursor is None
    assert _paths(_search(api, CheckpointSearchRequest(base_models=[BASE_MODEL, "other"], limit=200))) == walked
    assert _search(api, CheckpointSearchRequest(base_models=["other"])).checkpoints == []


def test_published_checkpoints_are_found_by_owner(api: InProcessApi) -> None:
    alices, bobs, now = _run(api, "alice"), _run(api, "bob"), time.time()
    mine = _save(api, alices, "mine", now - 3)
    hidden = _save(api, bobs, "hidden", now - 2)
    shared = _save(api, bobs, "shared", now - 1, public=True)
    bob = api.user_id("bob")
    assert _paths(_search(api, CheckpointSearchRequest())) == [mine]
    assert _paths(_search(api, CheckpointSearchRequest(owner=AccessibleSearchOwner()))) == [shared, mine]
    assert _paths(_search(api, CheckpointSearchRequest(owner=UserSearchOwner(owner_urns=[bob])))) == [shared]
    assert _paths(_search(api, CheckpointSearchRequest(), user="bob")) == [shared, hidden]
    carol = _search(api, CheckpointSearchRequest(owner=AccessibleSearchOwner()), user="carol")
    assert _paths(carol) == [shared] and hidden not in _paths(carol)


def test_base_model_on_every_checkpoint_view(api: InProcessApi) -> None:
    model_id = _run(api, "alice")
    _save(api, model_id, "a", time.time())
    of_run = api.get(f"/api/v1/training_runs/{model_id}/checkpoints").json()["checkpoints"]
    of_user = api.get("/api/v1/checkpoints").json()["checkpoints"]
    for views in (of_run, of_user):
        assert [Checkpoint039.model_validate(v).base_model for v in views] == [BASE_MODEL]


BAD_SEARCHES: list[tuple[dict, str]] = [
    ({"limit": 0}, "limit"),
    ({"limit": 201}, "limit"),  # over limits.max_checkpoint_search_page
    ({"checkpoint_type": "snapshot"}, "checkpoint_type"),
    ({"owner": {"type": "team"}}, "owner.type"),
    ({"owner": {"type": "user"}}, "owner.owner_urns"),
    ({"owner": {"type": "user", "owner_urns": [f"u{i}" for i in range(11)]}}, "owner.owner_urns"),
    ({"user_metadata": {f"k{i}": "v" for i in range(33)}}, "user_metadata"),  # limits.max_search_terms
    ({"base_models": ["m"] * 33}, "base_models"),
    (
        {"cursor": {"last_created_at": "yesterday", "last_checkpoint_uuid": "tinker://r/weights/a"}},
        "cursor.last_created_at",
    ),
    (
        {"cursor": {"last_created_at": "2026-11-29T00:00:00Z", "last_checkpoint_uuid": "c-1"}},
        "cursor.last_checkpoint_uuid",
    ),
]


def test_bad_searches_are_refused_naming_the_field(api: InProcessApi) -> None:
    for body, field in BAD_SEARCHES:
        refused(api.post(SEARCH, body), field)


def test_the_page_size_is_a_configured_limit(make_api: Callable[..., InProcessApi]) -> None:
    api = make_api(max_checkpoint_search_page=3)
    body = refused(api.post(SEARCH, {"limit": 4}), "limit")
    assert "limits.max_checkpoint_search_page=3" in body["error"]
    assert api.post(SEARCH, {"limit": 3}).json() == {"checkpoints": [], "next_cursor": None}


def test_capabilities_name_the_sdk_range(api: InProcessApi) -> None:
    answer = api.get("/api/v1/get_server_capabilities").json()
    assert answer["supported_sdk_versions"] == {"min": "0.25", "max": "0.40"}
    assert GetServerCapabilitiesResponse.model_validate(answer).supported_models[0].model_name == BASE_MODEL
