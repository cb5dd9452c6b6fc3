"""SessionViews on SQLite and PostgreSQL: pages, one session with its runs and samplers, search (names, metadata,
projects, statuses, cursor paging) and moving a session into a project."""

from __future__ import annotations

import asyncio
import time

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.checkpoints import CheckpointRecord, CheckpointStore
from app.db.metadata import MetadataStore, TrainingRun
from app.db.sampling_sessions import SamplingSession, SamplingSessionStore
from app.db.session_views import SessionInfo, SessionQuery, SessionViews
from app.errors import NotFound
from app.storage.paths import CheckpointPath
from tests.conftest import run_on_db


async def _sessions(meta: MetadataStore, count: int) -> list[str]:
    """`count` sessions, oldest first: even ones named "nightly run N" in project p-even, odd ones unlabelled."""
    ids = []
    for i in range(count):
        labels = ("p-even", f"Nightly run {i}") if i % 2 == 0 else (None, None)
        ids.append(await meta.create_session("0.38", [], {"i": str(i), "team": "a" if i < 3 else "b"}, *labels))
        await asyncio.sleep(0.002)
    return ids


def _run(model_id: str, session_id: str) -> TrainingRun:
    lora = {"rank": 8, "seed": 0}
    return TrainingRun(model_id, session_id, "tiny", 8, "policy", "tiny", lora, {}, time.time(), False)


def test_pages_get_and_members(db_url: str) -> None:
    async def body(db: AsyncEngine) -> None:
        meta, views = MetadataStore(db), SessionViews(db)
        ids = await _sessions(meta, 3)
        assert await views.page(2, 0) == ([ids[2], ids[1]], 3)
        assert await views.page(2, 2) == ([ids[0]], 3)
        info = await views.get(ids[0])
        assert (info.display_name, info.project_id, info.user_metadata["i"]) == ("Nightly run 0", "p-even", "0")
        with pytest.raises(NotFound) as err:
            await views.get("nope")
        assert err.value.field == "session_id"
        await meta.add_training_run(_run(f"{ids[0]}:train:0", ids[0]))
        await SamplingSessionStore(db).create(
            SamplingSession(f"{ids[0]}:sample:0", ids[0], "tiny", None, None, False, 1.0)
        )
        assert await views.members(ids[0]) == ([f"{ids[0]}:train:0"], [f"{ids[0]}:sample:0"])
        assert await views.members(ids[1]) == ([], [])
        path = CheckpointPath(f"{ids[0]}:train:0", "weights", "c1")
        await CheckpointStore(db).commit(CheckpointRecord(path, "loc", 1234, time.time()), overwrite=False)
        assert await views.checkpoint_totals([ids[0], ids[1]]) == {ids[0]: (1, 1234)}

    run_on_db(db_url, body)


def test_search_filters_and_pages(db_url: str) -> None:
    async def body(db: AsyncEngine) -> None:
        meta, views = MetadataStore(db), SessionViews(db)
        ids = await _sessions(meta, 7)
        newest_first = list(reversed(ids))

        async def found(q: SessionQuery, limit: int = 50) -> list[str]:
            page, _ = await views.search(q, limit)
            return [s.session_id for s in page]

        assert await found(SessionQuery()) == newest_first
        assert await found(SessionQuery(display_name="RUN nightly")) == [ids[6], ids[4], ids[2], ids[0]]
        assert await found(SessionQuery(display_name="run 4")) == [ids[4]]
        assert await found(SessionQuery(session_id=ids[1], display_name="run 4")) == [ids[4], ids[1]]  # either
        assert await found(SessionQuery(user_metadata={"team": "a"})) == [ids[2], ids[1], ids[0]]
        assert await found(SessionQuery(user_metadata={"team": "a", "i": "1"})) == [ids[1]]
        assert await found(SessionQuery(project_ids=["p-even"], user_metadata={"team": "b"})) == [ids[6], ids[4]]
        await meta.finish_session(ids[3], "errored")
        finished = SessionQuery(matches_status=lambda s: s.finished_reason is not None)
        assert await found(finished) == [ids[3]]

        walked, before = [], None  # pages of two, each from the cursor of the previous page's last
        while True:
            page, more = await views.search(SessionQuery(before=before), 2)
            walked += [s.session_id for s in page]
            if not more:
                break
            before = (page[-1].created_at, page[-1].session_id)
        assert walked == newest_first

        await views.set_project(ids[1], "p-moved")
        await views.set_project(ids[0], "p-moved")  # a labelled session keeps its name
        assert await found(SessionQuery(project_ids=["p-moved"])) == [ids[1], ids[0]]
        assert (await views.get(ids[0])).display_name == "Nightly run 0"
        with pytest.raises(NotFound):
            await views.set_project("nope", "p")

    run_on_db(db_url, body)


def test_a_cursor_survives_microsecond_rounding(db_url: str) -> None:
    """Cursors travel as RFC 3339 datetimes (microseconds); stored times have more digits."""

    async def body(db: AsyncEngine) -> None:
        meta, views = MetadataStore(db), SessionViews(db)
        ids = await _sessions(meta, 3)
        page, more = await views.search(SessionQuery(), 1)
        assert more and page[0].session_id == ids[2]
        rounded = round(page[0].created_at, 6) + 4e-7
        rest, _ = await views.search(SessionQuery(before=(rounded, page[0].session_id)), 5)
        assert [s.session_id for s in rest] == [ids[1], ids[0]]

    run_on_db(db_url, body)


def test_name_words_match_literally(db_url: str) -> None:
    async def body(db: AsyncEngine) -> None:
        meta, views = MetadataStore(db), SessionViews(db)
        percent = await meta.create_session("0.38", [], {}, display_name="100% done")
        await meta.create_session("0.38", [], {}, display_name="100 x done")
        under = await meta.create_session("0.38", [], {}, display_name="a_b")
        await meta.create_session("0.38", [], {}, display_name="axb")
        assert [s.session_id for s in (await views.search(SessionQuery(display_name="0%"), 10))[0]] == [percent]
        assert [s.session_id for s in (await views.search(SessionQuery(display_name="a_"), 10))[0]] == [under]

    run_on_db(db_url, body)


def test_session_info_defaults() -> None:
    info = SessionInfo("s", 1.0, None)
    assert SessionQuery(user_metadata={"a": "1"}).matches(info) is False
    assert SessionQuery().matches(info) is True
