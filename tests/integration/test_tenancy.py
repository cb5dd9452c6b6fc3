"""Two users on one server (the embedded default: each `tml-` key is its own user). Bob tries every route that takes
an id or a tinker:// path against each kind of Alice's objects, private and published: nothing of hers is read or
changed except her published checkpoints, which he may read, and every refusal is exactly what a missing object
of the same shape answers."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
import tinker
from tinker import types

from tests.integration.conftest import BASE_MODEL
from tests.integration.helpers import future_result, raw_client

ALICE, BOB = "tml-alice-tenancy", "tml-bob-tenancy"
PROMPT = {"chunks": [{"type": "encoded_text", "tokens": [20, 21, 22, 23]}]}
KINDS = {
    "weights": "save_weights",
    "sampler_weights": "save_weights_for_sampler",
    "external_weights": "save_weights_external",
}


@dataclass(frozen=True)
class Objects:
    """One user's objects (or made-up ones of the same shapes): the names tests fill into routes."""

    session: str
    model: str
    sampler: str
    future: str
    checkpoints: dict[str, str]  # "{kind}/{private|published}" -> tinker path

    def names(self) -> dict[str, str]:
        """Each id by the placeholder that stands for it, longest first (ids contain the session id)."""
        named = {"<MODEL>": self.model, "<SAMPLER>": self.sampler, "<FUTURE>": self.future, "<SESSION>": self.session}
        named |= {f"<{key}>": path for key, path in self.checkpoints.items()}
        return dict(sorted(named.items(), key=lambda item: -len(item[1])))


def _alices_objects(http: httpx.Client) -> Objects:
    """A session, a trained model, a checkpoint of every kind private and published, a sampler and a sample."""
    session = http.post("/api/v1/create_session", json={}).json()["session_id"]
    created = http.post(
        "/api/v1/create_model",
        json={"session_id": session, "model_seq_id": 0, "base_model": BASE_MODEL, "lora_config": {"rank": 4}},
    ).json()
    model = future_result(http, created["request_id"])["model_id"]
    checkpoints, seq = {}, 1
    for kind, route in KINDS.items():
        for visibility in ("private", "published"):
            saved = http.post(f"/api/v1/{route}", json={"model_id": model, "seq_id": seq, "path": visibility}).json()
            path = future_result(http, saved["request_id"])["path"]
            checkpoints[f"{kind}/{visibility}"] = path
            if visibility == "published":
                published = http.post(f"/api/v1/training_runs/{model}/checkpoints/{kind}/published/publish")
                assert published.status_code == 200, published.text
            seq += 1
    sampler = http.post(
        "/api/v1/create_sampling_session",
        json={
            "session_id": session,
            "sampling_session_seq_id": 0,
            "model_path": checkpoints["sampler_weights/private"],
        },
    ).json()["sampling_session_id"]
    future = http.post(
        "/api/v1/asample",
        json={
            "sampling_session_id": sampler,
            "seq_id": 1,
            "num_samples": 1,
            "prompt": PROMPT,
            "sampling_params": {"max_tokens": 2},
        },
    ).json()["request_id"]
    future_result(http, future)
    return Objects(session, model, sampler, future, checkpoints)


def _ghosts(alice: Objects) -> Objects:
    """Ids of the same shapes that belong to nobody."""
    session = uuid.uuid4().hex[:16]
    model = f"{session}:train:0"
    return Objects(
        session,
        model,
        f"{session}:sample:0",
        uuid.uuid4().hex,
        {key: path.replace(alice.model, model) for key, path in alice.checkpoints.items()},
    )


def _probes(o: Objects, mine: str) -> Iterator[tuple[str, str, dict | None]]:
    """(method, route, JSON body) of every route that takes one of `o`'s ids or paths; `mine` is Bob's own session,
    where a route also needs a destination."""
    yield "POST", "/api/v1/session_heartbeat", {"session_id": o.session}
    yield "GET", f"/api/v1/sessions/{o.session}", None
    yield "PUT", f"/api/v1/sessions/{o.session}/project", {"project_id": "stolen"}
    yield "GET", f"/api/v1/sessions/{o.session}/trace_export", None
    new_model = {"model_seq_id": 7, "base_model": BASE_MODEL, "lora_config": {"rank": 4}}
    yield "POST", "/api/v1/create_model", {"session_id": o.session, **new_model}
    yield (
        "POST",
        "/api/v1/create_sampling_session",
        {"session_id": o.session, "sampling_session_seq_id": 7, "base_model": BASE_MODEL},
    )
    yield "POST", "/api/v1/get_info", {"model_id": o.model}
    yield "POST", "/api/v1/unload_model", {"model_id": o.model}
    adam = {"learning_rate": 0.1, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8}
    yield "POST", "/api/v1/optim_step", {"model_id": o.model, "seq_id": 50, "adam_params": adam}
    for route in KINDS.values():
        yield "POST", f"/api/v1/{route}", {"model_id": o.model, "seq_id": 50, "path": "mine-now"}
    yield (
        "POST",
        "/api/v1/load_weights",
        {"model_id": o.model, "seq_id": 50, "path": o.checkpoints["weights/published"]},
    )
    yield "GET", f"/api/v1/training_runs/{o.model}", None
    yield "GET", f"/api/v1/training_runs/{o.model}/checkpoints", None
    yield "GET", f"/api/v1/samplers/{o.sampler}", None
    sample = {
        "sampling_session_id": o.sampler,
        "seq_id": 50,
        "num_samples": 1,
        "prompt": PROMPT,
        "sampling_params": {"max_tokens": 2},
    }
    yield "POST", "/api/v1/asample", sample
    yield "POST", "/api/v1/join_sampling_session", {"sampling_session_id": o.sampler}
    target = {"type": "sampling_session", "sampling_session_id": o.sampler, "cloned_sampler_id": 0}
    yield "POST", "/api/v1/retrieve_futures", {"target": target, "timeout": 0}
    yield "POST", "/api/v1/retrieve_future", {"request_id": o.future}
    yield "POST", "/api/v1/cancel_future", {"request_id": o.future}
    for key, path in o.checkpoints.items():
        run, _, checkpoint_id = path.removeprefix("tinker://").partition("/")
        base = f"/api/v1/training_runs/{run}/checkpoints/{checkpoint_id}"
        yield "POST", f"{base}/publish", None
        yield "DELETE", f"{base}/publish", None
        yield "PUT", f"{base}/ttl", {"ttl_seconds": 3600}
        yield "DELETE", base, None
        if key.endswith("published"):  # readable by everyone: tested on their own below
            continue
        yield "POST", "/api/v1/weights_info", {"tinker_path": path}
        if not key.startswith("external_weights"):  # the kinds each route takes
            yield "POST", "/api/v1/copy_weights", {"source_path": path}
            yield (
                "POST",
                "/api/v1/create_sampling_session",
                {"session_id": mine, "sampling_session_seq_id": 9, "model_path": path},
            )
        if key.startswith("weights"):
            yield "POST", "/api/v1/load_weights", {"session_id": mine, "model_seq_id": 9, "path": path}
        if key.startswith("external_weights"):
            yield "GET", f"{base}/external_weights_urls", None


def _masked(response: httpx.Response, objects: Objects) -> tuple[int, str]:
    text = response.text
    for placeholder, value in objects.names().items():
        text = text.replace(value, placeholder)
    return response.status_code, text


@pytest.fixture(scope="module")
def alice(base_url: str) -> Iterator[tuple[httpx.Client, Objects]]:
    with raw_client(base_url, ALICE) as http:
        yield http, _alices_objects(http)


def test_another_users_objects_answer_as_missing_ones(base_url: str, alice: tuple[httpx.Client, Objects]) -> None:
    alice_http, hers = alice
    ghosts = _ghosts(hers)
    with raw_client(base_url, BOB) as bob:
        mine = bob.post("/api/v1/create_session", json={}).json()["session_id"]
        probes = list(zip(_probes(hers, mine), _probes(ghosts, mine), strict=True))
        for (method, route, body), (_, ghost_route, ghost_body) in probes:
            theirs = _masked(bob.request(method, route, json=body), hers)
            missing = _masked(bob.request(method, ghost_route, json=ghost_body), ghosts)
            assert theirs == missing, (method, route, theirs, missing)
            assert theirs[0] in (404, 410), (route, theirs)  # heartbeats answer 410 for a missing session
        finish = bob.post(f"/api/v1/sessions/{hers.session}/finish", json={})
        assert (finish.status_code, finish.json()) == (200, {})  # as for a missing session
        print(f"cross-user matrix: {len(probes)} routes x objects refused as missing")

    # Nothing of Alice's changed: her session is open, her model answers, her checkpoints are all there as they were.
    assert alice_http.post("/api/v1/session_heartbeat", json={"session_id": hers.session}).status_code == 200
    assert alice_http.post("/api/v1/get_info", json={"model_id": hers.model}).json()["model_id"] == hers.model
    listed = alice_http.get(f"/api/v1/training_runs/{hers.model}/checkpoints").json()["checkpoints"]
    assert {c["tinker_path"]: c["public"] for c in listed} == {
        path: key.endswith("published") for key, path in hers.checkpoints.items()
    }
    assert alice_http.get(f"/api/v1/sessions/{hers.session}").json()["training_run_ids"] == [hers.model]


def test_published_checkpoints_are_readable_by_everyone(base_url: str, alice: tuple[httpx.Client, Objects]) -> None:
    _, hers = alice
    with raw_client(base_url, BOB) as bob:
        mine = bob.post("/api/v1/create_session", json={}).json()["session_id"]
        info = bob.post("/api/v1/weights_info", json={"tinker_path": hers.checkpoints["weights/published"]})
        assert (info.status_code, info.json()["lora_rank"]) == (200, 4)
        run, _, export = hers.checkpoints["external_weights/published"].removeprefix("tinker://").partition("/")
        urls = bob.get(f"/api/v1/training_runs/{run}/checkpoints/{export}/external_weights_urls").json()["urls"]
        assert all(httpx.get(url).status_code == 200 for url in urls.values()) and urls
        copied = bob.post("/api/v1/copy_weights", json={"source_path": hers.checkpoints["weights/published"]}).json()
        assert hers.model not in copied["tinker_path"]  # the copy is Bob's, in a run of his
        loaded = bob.post(
            "/api/v1/load_weights",
            json={"session_id": mine, "model_seq_id": 0, "path": hers.checkpoints["weights/published"]},
        ).json()
        assert future_result(bob, loaded["request_id"])["model_id"] == f"{mine}:train:0"

        listed = bob.get("/api/v1/checkpoints").json()["checkpoints"]
        hers_listed = {c["tinker_path"] for c in listed if hers.model in c["tinker_path"]}
        assert hers_listed == {path for key, path in hers.checkpoints.items() if key.endswith("published")}
        assert all(c["public"] for c in listed if hers.model in c["tinker_path"])
        for route in ("/api/v1/sessions", "/api/v1/training_runs"):
            assert hers.session not in bob.get(route).text, route
        search = bob.post("/api/v1/sessions/search", json={"session_id": hers.session}).json()
        assert search["sessions"] == []
        hour = time.strftime("%Y-%m-%dT%H:00:00Z", time.gmtime())
        window = {
            "starting_on": hour,
            "ending_before": time.strftime("%Y-%m-%dT%H:00:00Z", time.gmtime(time.time() + 3600)),
        }
        assert hers.session not in bob.get("/api/v1/billing/usage/events", params=window).text
        assert hers.session not in bob.get("/api/v1/billing/usage/checkpoints/current").text

    # Through the SDK: Bob samples from Alice's published sampler weights; her private ones do not exist for him.
    service = tinker.ServiceClient(base_url=base_url, api_key=BOB)
    try:
        params = types.SamplingParams(max_tokens=2, temperature=0.0, seed=0)
        published = service.create_sampling_client(model_path=hers.checkpoints["sampler_weights/published"]).result()
        assert len(published.sample(types.ModelInput.from_ints([20, 21]), 1, params).result().sequences[0].tokens) > 0
        with pytest.raises(tinker.NotFoundError):
            service.create_sampling_client(model_path=hers.checkpoints["sampler_weights/private"]).result()
    finally:
        service.close("success").result()


def test_the_audit_log_shows_each_user_their_own_and_reads_of_theirs(
    base_url: str, alice: tuple[httpx.Client, Objects]
) -> None:
    """After the tests above: Alice's log holds her publishing and Bob's reads of what she published (with what
    for); Bob's holds his reads but none of her own events."""
    _, hers = alice

    def log(key: str) -> list[tinker.types.AuditLogEntry]:
        return tinker.AdminClient(base_url=base_url, api_key=key).get_audit_log(event_type="all").result().entries

    alices = log(ALICE)
    published = {e.tinker_path for e in alices if e.event == "checkpoint_published"}
    assert published == {path for key, path in hers.checkpoints.items() if key.endswith("published")}
    reads = [e for e in alices if e.event == "checkpoint_read"]
    assert {e.purpose for e in reads} == {"weights_info", "download", "copy", "load", "sample"}
    assert {e.event_details["owner"] for e in reads} == {
        e.event_details["actor"] for e in alices if e.event == "checkpoint_published"
    }
    bobs = log(BOB)
    assert {e.event for e in bobs} >= {"checkpoint_read", "apikey_used"}
    assert not [
        e
        for e in bobs
        if e.event == "checkpoint_published" or e.event_details.get("actor") == reads[0].event_details["owner"]
    ]
    checkpoints_only = tinker.AdminClient(base_url=base_url, api_key=ALICE).get_audit_log(event_type="checkpoints")
    assert {e.event.split("_")[0] for e in checkpoints_only.result().entries} == {"checkpoint"}


def test_a_revoked_checkpoint_stops_serving_its_samplers(base_url: str, alice: tuple[httpx.Client, Objects]) -> None:
    """Last (it unpublishes, then deletes): Bob's sampler on Alice's published weights answers as a missing checkpoint
    once she unpublishes them, while hers still samples; once she deletes them, hers answers so too."""
    alice_http, hers = alice
    path = hers.checkpoints["sampler_weights/published"]
    run, _, checkpoint_id = path.removeprefix("tinker://").partition("/")
    checkpoint = f"/api/v1/training_runs/{run}/checkpoints/{checkpoint_id}"
    prompt, params = types.ModelInput.from_ints([20, 21]), types.SamplingParams(max_tokens=2, temperature=0.0, seed=0)
    bob, owner = (tinker.ServiceClient(base_url=base_url, api_key=key) for key in (BOB, ALICE))
    try:
        bobs, alices = (client.create_sampling_client(model_path=path).result() for client in (bob, owner))
        assert bobs.sample(prompt, 1, params).result().sequences  # served, and cached on the sampler
        assert alice_http.delete(f"{checkpoint}/publish").status_code == 200
        with pytest.raises(tinker.NotFoundError, match="model_path"):
            bobs.sample(prompt, 1, params).result()
        assert alices.sample(prompt, 1, params).result().sequences
        assert alice_http.delete(checkpoint).status_code == 200
        with pytest.raises(tinker.NotFoundError, match="model_path"):
            alices.sample(prompt, 1, params).result()
    finally:
        for client in (bob, owner):
            client.close("success").result()
