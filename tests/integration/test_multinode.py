"""Multi-node operation on a real three-node Ray cluster on loopback (ray.cluster_utils.Cluster; every node's
servers on 127.0.0.1, see tests/conftest.py), with its own cluster fixture. It runs first, before the shared
single-node Ray of the other modules starts.

- head node: Serve's controller, HAProxy (the clusters' ingress) and the two Ingress replicas (they need no CPU);
- `trainer_node`: the two Ray Train workers of the policy trainer, placed by a custom resource;
- `sampler_node`: the vLLM Sampler replica, placed by another custom resource.

Weights go from the trainer's workers to the sampler only through S3 (moto's server on 127.0.0.1); the futures
database is one SQLite file that every ingress replica opens. A policy trains, saves for the sampler and is
sampled on the other node; each ingress replica answers retrieve_future for futures the other one created.
"""

from __future__ import annotations

import re
import sqlite3
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import ray
import tinker
from ray import serve
from ray._common.utils import get_ray_address_file
from ray.cluster_utils import Cluster
from ray.util.state import list_actors
from tinker import types

from app.models.embedded import build_embedded_model
from deployments import serve_env
from deployments.builder import build_app
from tests.conftest import TINY_MODEL, free_port
from tests.integration.conftest import server_config, wait_ready
from tests.integration.helpers import new_client, sft_datums, trainer_logprobs
from tests.s3 import S3_ENV, s3_keys, s3_server

ATOL = 2e-4  # sampler vs trainer logprobs, fp32 on CPU (as in test_sampling)
PROBES = 16  # retrieve_future calls; both replicas answer some of them unless routing is broken (p = 2**-15)


def _node(cluster: Cluster, **args) -> str:
    return cluster.add_node(node_ip_address="127.0.0.1", **args).node_id


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    """The cluster, the app on it, and where everything is: (url, state_dir, storage_uri, node ids, session dir)."""
    assert not ray.is_initialized(), "test_multinode must run before the shared single-node Ray starts"
    state_dir = tmp_path_factory.mktemp("multinode-state")
    build_embedded_model("tiny", TINY_MODEL)
    with s3_server("multinode") as storage_uri, pytest.MonkeyPatch.context() as env:
        # A cluster's ingress, as the manifests set it (deployments/serve_env.CLUSTER): HAProxy on the head forwards
        # to each Ingress replica's own server (ports from Serve's default range, on 127.0.0.1). Its stats and
        # metrics listeners bind every interface: give them free ports.
        for name, value in serve_env.CLUSTER.items():
            env.setenv(name, value)
        for name in serve_env.PORT_RANGE:
            env.delenv(name)
        env.setenv("RAY_SERVE_HAPROXY_STATS_PORT", str(free_port()))
        env.setenv("RAY_SERVE_HAPROXY_METRICS_PORT", str(free_port()))
        # Cluster writes the head's address into the default temp dir's address file even with a temp_dir of its
        # own, and fails on a machine where Ray never ran unless that directory exists.
        Path(get_ray_address_file(None)).parent.mkdir(parents=True, exist_ok=True)
        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 1,
                "node_ip_address": "127.0.0.1",
                "include_dashboard": True,
                "dashboard_host": "127.0.0.1",
                "temp_dir": f"/tmp/tsmn-{int(time.time())}",
            },
        )  # short: Ray's socket paths have a length limit
        nodes = {
            "head": cluster.head_node.node_id,
            "trainer": _node(cluster, num_cpus=2, resources={"trainer_node": 2}),
            "sampler": _node(cluster, num_cpus=1, resources={"sampler_node": 1}),
        }
        try:
            cluster.wait_for_nodes()
            ray.init(
                address=cluster.address,
                runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1", "RAY_AUTH_MODE": "disabled", **S3_ENV}},
            )
            port = free_port()  # HAProxy's
            serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
            config = server_config(state_dir)
            base = config["base_models"][0]
            base.pop("critic_trainer")
            base["trainer"] = {**base["trainer"], "resources": {"trainer_node": 1}}
            base["sampler"] = {**base["sampler"], "num_cpus": 1, "resources": {"sampler_node": 1}}
            serve.run(
                build_app({**config, "storage_uri": storage_uri, "ingress_replicas": 2}),
                name="tinker",
                route_prefix="/",
            )
            url = f"http://127.0.0.1:{port}"
            wait_ready(url)
            yield url, state_dir, storage_uri, nodes, Path(cluster.head_node.get_session_dir_path())
        finally:
            if ray.is_initialized():
                serve.shutdown()
                ray.shutdown()
            cluster.shutdown()


@pytest.fixture(scope="module")
def client(cluster) -> tinker.ServiceClient:
    service = tinker.ServiceClient(base_url=cluster[0], api_key="tml-multinode")
    yield service
    service.close("success").result()


def _actor_nodes(class_name: str) -> list[str]:
    return [a.node_id for a in list_actors(filters=[("class_name", "=", class_name), ("state", "=", "ALIVE")])]


def test_trainer_workers_and_sampler_replica_run_on_their_own_nodes(cluster) -> None:
    nodes = cluster[3]
    assert _actor_nodes("RayTrainWorker") == [nodes["trainer"]] * 2
    assert _actor_nodes("ServeReplica:tinker:Sampler:tinker-serve/tiny") == [nodes["sampler"]]
    assert len(_actor_nodes("ServeReplica:tinker:Ingress")) == 2


def _replica_logs(session_dir: Path, deployment: str) -> dict[str, str]:
    """Each replica's Serve log file of `deployment` (e.g. `Ingress`, `Sampler_tinker-serve_tiny`), by replica."""
    files = session_dir.glob(f"logs/serve/replica_tinker_{deployment}_*.log")
    return {f.stem.rsplit("_", 1)[-1]: f.read_text() for f in files}


def _wait_for_log_line(session_dir: Path, deployment: str, pattern: str) -> None:
    deadline = time.monotonic() + 30
    while not any(re.search(pattern, text) for text in _replica_logs(session_dir, deployment).values()):
        assert time.monotonic() < deadline, f"no {pattern!r} in the {deployment} replica logs"
        time.sleep(1)


def test_policy_trained_on_one_node_is_sampled_on_another_through_s3(cluster, client) -> None:
    _, state_dir, storage_uri, _, session_dir = cluster
    tc = new_client(client, seed=81)
    data = sft_datums(tc.get_tokenizer())
    losses = []
    for _ in range(4):
        losses.append(tc.forward_backward(data, "cross_entropy").result().metrics["loss:sum"])
        tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    assert losses[-1] < 0.9 * losses[0], losses

    path = tc.save_weights_for_sampler("multinode").result().path
    assert any(k.endswith("adapter_model.safetensors") for k in s3_keys(storage_uri, f"{tc.model_id}/sampler_weights"))
    assert not (state_dir / "checkpoints").exists() or not any((state_dir / "checkpoints").rglob("*.safetensors"))

    sampler = client.create_sampling_client(model_path=path)
    prompt = tc.get_tokenizer().encode("What is 12 + 7? The answer")
    result = sampler.sample(
        types.ModelInput.from_ints(prompt), 2, types.SamplingParams(max_tokens=8, temperature=1.0, seed=5)
    ).result()
    for seq in result.sequences:
        assert len(seq.tokens) == len(seq.logprobs) == 8
        np.testing.assert_allclose(seq.logprobs, trainer_logprobs(tc, prompt + seq.tokens)[-8:], atol=ATOL)

    # Each replica's log file has the request lines (the sampler's once stopped when vLLM started).
    model = re.escape(tc.model_id)
    _wait_for_log_line(
        session_dir,
        "Trainer_tinker-serve_tiny",
        rf"ran op=forward_backward model_id={model} seq_id=1 tinker_request_id=\w+ outcome=ok",
    )
    _wait_for_log_line(
        session_dir,
        "Sampler_tinker-serve_tiny",
        rf"ran op=sample base_model=tinker-serve/tiny adapter={model}/sampler_weights/multinode/\w+ "
        r"tinker_request_id=\w+ outcome=ok tokens=16",
    )


def test_each_ingress_replica_answers_futures_the_other_created(cluster, client) -> None:
    url, state_dir, _, _, session_dir = cluster
    tc = new_client(client, seed=82)
    tc.forward_backward(sft_datums(tc.get_tokenizer(), count=2), "cross_entropy").result()
    with sqlite3.connect(state_dir / "tinker_serve.db") as db:
        (request_id,) = db.execute(
            "SELECT request_id FROM futures WHERE subject_id = ? AND seq_id = 1", (tc.model_id,)
        ).fetchone()

    answers = []
    with httpx.Client(base_url=url, timeout=60, headers={"X-API-Key": "tml-multinode"}) as http:
        for i in range(PROBES):
            response = http.post(
                "/api/v1/retrieve_future",
                json={"request_id": request_id},
                headers={"X-Request-ID": f"probe-{request_id}-{i}"},
            )
            assert response.status_code == 200
            answers.append(response.content)
    assert b"loss_fn_outputs" in answers[0]
    assert [answer for answer in answers if answer != answers[0]] == [], "replicas must answer byte for byte alike"

    # The structured log line of the submit is in the log of the replica that created the future; Serve's
    # access log shows which replica answered each probe (Serve keeps a client's X-Request-ID).
    deadline = time.monotonic() + 30
    while True:
        logs = _replica_logs(session_dir, "Ingress")
        creator = [
            r
            for r, text in logs.items()
            if re.search(
                rf"queued op=forward_backward model_id={re.escape(tc.model_id)} seq_id=1 "
                rf"tinker_request_id={request_id}",
                text,
            )
        ]
        answered = {r for r, text in logs.items() for i in range(PROBES) if f"probe-{request_id}-{i} " in text}
        if len(logs) == 2 and creator and answered == set(logs):
            break
        assert time.monotonic() < deadline, f"replicas {sorted(logs)}: creator {creator}, answered {answered}"
        time.sleep(1)
    assert len(creator) == 1 and answered - set(creator), "the other replica never answered the creator's future"
