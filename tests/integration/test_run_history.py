"""A run's history through REST (GET training_runs/{id}/history): every forward_backward, forward and optim_step
the SDK ran, in order, with the very metrics the SDK got back, the learning rate and tokens; paged; another user's
run is a 404 like a missing one."""

from __future__ import annotations

import tinker

from tests.integration.helpers import new_client, raw_client, sft_datums


def test_a_runs_history_holds_every_step_with_its_metrics(service_client: tinker.ServiceClient, base_url: str):
    tc = new_client(service_client, seed=61)
    data = sft_datums(tc.get_tokenizer())
    losses, rates = [], [1e-2, 5e-3, 2e-3]
    for rate in rates:
        losses.append(tc.forward_backward(data, "cross_entropy").result().metrics["loss:sum"])
        tc.optim_step(tinker.types.AdamParams(learning_rate=rate)).result()
    final = tc.forward(data, "cross_entropy").result().metrics["loss:sum"]
    tokens = sum(d.model_input.length for d in data)

    with raw_client(base_url, "tml-integration-tests") as http:
        first = http.get(f"/api/v1/training_runs/{tc.model_id}/history", params={"limit": 4}).json()
        assert len(first["points"]) == 4 and first["next_after_seq"] == first["points"][-1]["seq_id"]
        rest = http.get(
            f"/api/v1/training_runs/{tc.model_id}/history", params={"after_seq": first["next_after_seq"]}
        ).json()
        assert rest["next_after_seq"] is None
        points = first["points"] + rest["points"]
        assert [p["kind"] for p in points] == ["forward_backward", "optim_step"] * 3 + ["forward"]
        assert [p["seq_id"] for p in points] == list(range(1, 8))
        assert [p["metrics"]["loss:sum"] for p in points if p["kind"] != "optim_step"] == [*losses, final]
        assert [p["learning_rate"] for p in points if p["kind"] == "optim_step"] == rates
        assert [p["step"] for p in points] == [0, 1, 1, 2, 2, 3, 3]
        assert {p["tokens"] for p in points if p["kind"] != "optim_step"} == {tokens}
        assert all(p["time"] > 0 for p in points) and points == sorted(points, key=lambda p: p["time"])

    with raw_client(base_url, "tml-someone-else") as other:
        theirs = other.get(f"/api/v1/training_runs/{tc.model_id}/history")
        missing = other.get("/api/v1/training_runs/no-such-run:train:0/history")
        assert theirs.status_code == missing.status_code == 404
        assert theirs.json()["error"].replace(tc.model_id, "X") == missing.json()["error"].replace(
            "no-such-run:train:0", "X"
        )
