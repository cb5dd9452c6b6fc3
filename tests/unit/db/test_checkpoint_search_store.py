"""search_checkpoints' store (app.db.checkpoint_search) on both backends: every filter, whose checkpoints each `owner`
finds (another user's unpublished never; their published with `accessible` or by name), and paging by the
(created_at, path) cursor through checkpoints saved at the same instant, with user_metadata matched across scan
batches."""

from __future__ import annotations

import time
from dataclasses import replace

from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.checkpoint_search import CheckpointQuery, CheckpointSearch
from app.db.checkpoints import CheckpointRecord, CheckpointStore
from app.db.metadata import MetadataStore, TrainingRun
from app.storage.paths import CheckpointPath
from tests.conftest import run_on_db

ALICE, BOB, CAROL = "user-alice", "user-bob", "user-carol"
T0 = 1_800_000_000.0
ODD = 'a "quoted" \\ key_%'


async def _run(meta: MetadataStore, owner: str | None, base_model: str, project: str | None = None) -> str:
    session = await meta.create_session("0.39", [], {}, project, owner=owner)
    model_id = f"{session}:train:0"
    run = TrainingRun(model_id, session, base_model, 4, "policy", base_model, {"rank": 4}, {}, T0, False)
    await meta.add_training_run(run)
    return model_id


async def _save(
    store: CheckpointStore,
    model_id: str,
    name: str,
    at: float,
    kind: str = "weights",
    public: bool = False,
    metadata: dict[str, str] | None = None,
    expires_at: float | None = None,
) -> str:
    path = CheckpointPath(model_id, kind, name)
    record = CheckpointRecord(path, path.new_location(), 10, at, expires_at, public, metadata or {})
    await store.commit(record, overwrite=False)
    return path.uri


async def _uris(search: CheckpointSearch, q: CheckpointQuery, limit: int = 100) -> list[str]:
    found, more = await search.search(q, limit)
    assert not more
    return [c.record.path.uri for c in found]


def test_every_filter_newest_first(db_url: str) -> None:
    async def body(db: AsyncEngine) -> None:
        meta, store, search = MetadataStore(db), CheckpointStore(db), CheckpointSearch(db)
        tiny, big = await _run(meta, ALICE, "tiny", "p1"), await _run(meta, ALICE, "big", "p2")
        a = await _save(store, tiny, "a", T0 + 1, metadata={"step": "1", "tag": "x"})
        b = await _save(store, tiny, "b", T0 + 2, kind="sampler_weights", metadata={"step": "2", "tag": "x"})
        c = await _save(store, big, "c", T0 + 3, metadata={"step": "2"})
        d = await _save(store, big, "d", T0 + 4, kind="external_weights", metadata={ODD: "é 100%", "step": "x"})
        await _save(store, big, "gone", T0 + 5, expires_at=time.time() - 1)  # expired: never found

        everything = await search.search(CheckpointQuery(ALICE), 100)
        assert [c.record.path.uri for c in everything[0]] == [d, c, b, a]
        assert [c.base_model for c in everything[0]] == ["big", "big", "tiny", "tiny"]
        assert everything[0][0].to_json()["base_model"] == "big"
        cases: list[tuple[dict, list[str]]] = [
            ({"kind": "sampler_weights"}, [b]),
            ({"kind": "external_weights"}, [d]),
            ({"base_models": ["big"]}, [d, c]),
            ({"base_models": ["tiny", "big"]}, [d, c, b, a]),
            ({"base_models": []}, []),  # an empty list matches nothing (the SDK's docs)
            ({"project_ids": ["p1"]}, [b, a]),
            ({"project_ids": ["p2", "elsewhere"]}, [d, c]),
            ({"project_ids": []}, []),
            ({"user_metadata": {"step": "2"}}, [c, b]),
            ({"user_metadata": {"step": "2", "tag": "x"}}, [b]),  # every pair must hold
            ({"user_metadata": {"tag": "y"}}, []),
            ({"user_metadata": {"STEP": "2"}}, []),  # keys and values match exactly (SQLite's LIKE ignores case)
            ({"user_metadata": {ODD: "é 100%"}}, [d]),  # quotes, backslashes and LIKE's wildcards in a pair
            ({"user_metadata": {ODD: "é 1000"}}, []),
            ({"user_metadata": {'x\\" %_': "é 100%"}}, []),
            ({"kind": "weights", "base_models": ["tiny"], "project_ids": ["p1"]}, [a]),
        ]
        for filters, expected in cases:
            assert await _uris(search, CheckpointQuery(ALICE, **filters)) == expected, filters

    run_on_db(db_url, body)


def test_whose_checkpoints_each_owner_finds(db_url: str) -> None:
    async def body(db: AsyncEngine) -> None:
        meta, store, search = MetadataStore(db), CheckpointStore(db), CheckpointSearch(db)
        alices, bobs = await _run(meta, ALICE, "tiny"), await _run(meta, BOB, "tiny")
        legacy = await _run(meta, None, "t")
        mine = await _save(store, alices, "mine", T0 + 1)
        hidden = await _save(store, bobs, "hidden", T0 + 2)
        shared = await _save(store, bobs, "shared", T0 + 3, public=True)
        old = await _save(store, legacy, "old", T0 + 4)  # a session from before owners: everyone's

        def q(reader: str, owners: object) -> CheckpointQuery:
            return CheckpointQuery(reader, owners)  # type: ignore[arg-type]

        assert await _uris(search, q(ALICE, "own")) == [old, mine]
        assert await _uris(search, q(ALICE, "accessible")) == [old, shared, mine]
        assert await _uris(search, q(ALICE, (BOB,))) == [shared]  # Bob's published only
        assert await _uris(search, q(ALICE, (ALICE, BOB))) == [old, shared, mine]
        assert await _uris(search, q(CAROL, (BOB, "user-nobody"))) == [shared]
        assert await _uris(search, q(BOB, "own")) == [old, shared, hidden]
        assert await _uris(search, q(BOB, (ALICE,))) == []  # Alice published nothing
        for reader, owners in ((ALICE, "own"), (ALICE, "accessible"), (ALICE, (BOB,)), (CAROL, "accessible")):
            assert hidden not in await _uris(search, q(reader, owners))  # never, whatever the search
        assert await _uris(search, replace(q(ALICE, "accessible"), base_models=["t"])) == [old]

    run_on_db(db_url, body)


def test_paging_through_checkpoints_saved_at_once(db_url: str) -> None:
    """Five of seven checkpoints share one created_at: the cursor's path orders them, so pages of two visit each
    once, newest first. The odd ones' metadata differs from the even ones' only in case, which SQLite's LIKE
    ignores: a page of the even ones walks past them to fill up."""

    async def body(db: AsyncEngine) -> None:
        meta, store, search = MetadataStore(db), CheckpointStore(db), CheckpointSearch(db)
        runs = [await _run(meta, ALICE, "tiny") for _ in range(2)]
        saved = []
        for i in range(7):
            at = T0 + 10 if 1 <= i <= 5 else T0 + i
            saved.append(
                await _save(store, runs[i % 2], f"c{i}", at, metadata={"even": "yes" if i % 2 == 0 else "YES"})
            )

        async def walk(q: CheckpointQuery) -> list[list[str]]:
            pages = []
            while True:
                found, more = await search.search(q, 2)
                pages.append([c.record.path.uri for c in found])
                if not more:
                    return pages
                last = found[-1].record
                q = replace(q, before=(last.created_at, last.path))

        pages = await walk(CheckpointQuery(ALICE))
        expected = await _uris(search, CheckpointQuery(ALICE))
        assert [len(p) for p in pages] == [2, 2, 2, 1]
        assert [uri for page in pages for uri in page] == expected and sorted(expected) == sorted(saved)
        assert expected[-2:] == [saved[6], saved[0]]  # after the five saved at once (T0 + 10)
        evens = await walk(CheckpointQuery(ALICE, user_metadata={"even": "yes"}))
        assert evens == [[u for u in expected if u in (saved[2], saved[4])], [saved[6], saved[0]]]

    run_on_db(db_url, body)
