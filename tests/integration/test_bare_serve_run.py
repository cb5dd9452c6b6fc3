"""`serve run serve_config.yaml` as a Ray user types it, with none of `make serve`'s Serve settings: the embedded
config (only its state directory and proxy port moved, and a second base model added whose sampler setting vLLM
refuses) serves the Tinker API through Serve's proxy and says so once; the real SDK trains and samples through it;
the sampler that cannot start answers /ready and the SDK's samples with vLLM's reason, without being restarted;
stopped as a supervisor stops it (SIGTERM to its process group, SIGKILL after a grace period) after its Sampler
replica was killed and replaced, no process it started survives, vLLM's engine cores included. Its own Ray instance
(`serve run --address local` under a Ray temp dir of its own), before the shared one starts."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import tinker
import yaml
from tinker import types

from app.models.embedded import build_embedded_model
from deployments import serve_env
from tests import processes
from tests.conftest import ROOT, TINY_MODEL, free_port
from tests.integration.conftest import wait_ready
from tests.integration.helpers import sft_datums

GRACE_S = 30  # SIGTERM, then SIGKILL this much later
BASE = "tinker-serve/tiny"
UNSTARTABLE = "tinker-serve/unstartable"  # its sampler's dtype is one vLLM does not know
SERVE_SETTINGS = {*serve_env.single_node(0), *serve_env.CLUSTER}


def _started_by(marker: str) -> list[int]:
    """The live processes whose environment holds `marker` (every process of the Ray instance inherits its temp
    dir)."""
    return [p for p in processes.pids() if marker.encode() in processes.environ(p) and processes.alive(p)]


@dataclass
class BareServer:
    url: str  # Serve's proxy
    log: Path
    marker: str  # in the environment of every process it starts
    process: subprocess.Popen[bytes]  # `serve run`, leading a process group of its own
    unstartable_replicas: list[int]  # the pids of UNSTARTABLE's Sampler replicas once the app was up


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BareServer]:
    run = tmp_path_factory.mktemp("bare-serve-run")
    build_embedded_model("tiny", TINY_MODEL)
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    port = free_port()
    config["http_options"]["port"] = port
    args = config["applications"][0]["args"]
    args["state_dir"] = str(run / "state")
    args["base_models"][0]["path"] = str(TINY_MODEL)
    args["base_models"].append(
        {
            "name": UNSTARTABLE,
            "path": str(TINY_MODEL),
            "trainer": {"num_workers": 1, "cpus_per_worker": 0.25},
            "sampler": {"num_cpus": 0.25, "kv_cache_mib": 64, "dtype": "bfloat"},  # a typo: bfloat16
        }
    )
    (run / "serve_config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    ray_tmp = Path(tempfile.mkdtemp(prefix="bare-ray-", dir="/tmp"))  # Ray's socket paths must stay under 108 bytes
    env = {k: v for k, v in os.environ.items() if k not in SERVE_SETTINGS and k != "RAY_ADDRESS"}
    env |= {"RAY_TMPDIR": str(ray_tmp), "PYTHONPATH": str(ROOT)}
    marker = f"RAY_TMPDIR={ray_tmp}"
    serve = Path(sys.executable).parent / "serve"
    log = run / "server.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [str(serve), "run", "--address", "local", str(run / "serve_config.yaml")],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, budget_s=420, check=lambda: _still_running(server, log), done=_up_but_unstartable)
        yield BareServer(url, log, marker, server, _replicas(marker, f"Sampler:{UNSTARTABLE}"))
    finally:
        _stop(server)
        shutil.rmtree(ray_tmp, ignore_errors=True)


def _up_but_unstartable(answer: httpx.Response) -> bool:
    """/ready once everything answers but UNSTARTABLE's sampler, which said why it cannot start."""
    if answer.status_code != 503:
        return False
    body = answer.json()
    return all(body["trainers"].values()) and body["samplers"][BASE] and UNSTARTABLE in body.get("failed", {})


def _still_running(server: subprocess.Popen[bytes], log: Path) -> None:
    assert server.poll() is None, f"serve run exited {server.returncode}:\n{_tail(log)}"


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:]


def _stop(server: subprocess.Popen[bytes]) -> None:
    """As a supervisor stops it: SIGTERM to its process group, SIGKILL to the group GRACE_S later."""
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(timeout=GRACE_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGKILL)
    server.wait(timeout=30)


def test_it_trains_and_samples_through_serves_proxy_and_says_so(bare: BareServer) -> None:
    # Its session is finished before the module stops the server: left open, its heartbeat retries to the end.
    with tinker.ServiceClient(base_url=bare.url, api_key="tml-bare-serve-run") as client:
        tc = client.create_lora_training_client(base_model=BASE, rank=8, seed=5).result()
        data = sft_datums(tc.get_tokenizer())
        losses = []
        for _ in range(3):
            losses.append(tc.forward_backward(data, "cross_entropy").result().metrics["loss:sum"])
            tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        assert losses[-1] < losses[0], losses
        sampler = tc.save_weights_and_get_sampling_client().result()
        prompt = types.ModelInput.from_ints(tc.get_tokenizer().encode("What is 12 + 7? The answer"))
        (sequence,) = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=4)).result().sequences
    assert len(sequence.tokens) == 4
    warnings = [line for line in bare.log.read_text(errors="replace").splitlines() if "request-path settings" in line]
    assert len(warnings) == 1 and "make serve" in warnings[0], warnings


def test_a_sampler_that_cannot_start_says_why_and_is_not_restarted(bare: BareServer) -> None:
    ready = httpx.get(f"{bare.url}/ready", timeout=10)
    assert ready.status_code == 503
    reason = ready.json()["failed"][UNSTARTABLE]
    assert "could not start vLLM" in reason and "bfloat" in reason and "sampler" in reason, reason
    with tinker.ServiceClient(base_url=bare.url, api_key="tml-bare-serve-run") as client:
        sampler = client.create_sampling_client(base_model=UNSTARTABLE).result()
        prompt = types.ModelInput.from_ints([1, 2, 3])
        with pytest.raises(tinker.RequestFailedError, match="could not start vLLM") as failed:
            sampler.sample(prompt, 1, types.SamplingParams(max_tokens=2)).result(timeout=60)
    assert "bfloat" in str(failed.value)
    assert len(bare.unstartable_replicas) == 1  # the one replica, up since the app was; several health checks ago
    assert _replicas(bare.marker, f"Sampler:{UNSTARTABLE}") == bare.unstartable_replicas


def _engine_cores(marker: str) -> list[int]:
    return [p for p in _started_by(marker) if b"EngineCore" in processes.cmdline(p)]


def _replicas(marker: str, deployment: str) -> list[int]:
    return [p for p in _started_by(marker) if f"ServeReplica:tinker:{deployment}".encode() in processes.cmdline(p)]


def test_stopping_it_leaves_no_process_behind(bare: BareServer) -> None:
    """Runs last in the module: it stops the server. First the Sampler replica is SIGKILLed and Serve replaces it
    (outside `serve run`'s process group, so the stop's signals never reach it); then the server is stopped as a
    supervisor does. Ray's own processes share its fate, and vLLM's engine cores, children of Sampler replicas, must
    too: the replacement's was left an orphan before app.sampling.engine_core_guard."""
    (replica,) = _replicas(bare.marker, f"Sampler:{BASE}")
    os.kill(replica, signal.SIGKILL)
    deadline = time.monotonic() + 300
    while not (_replicas(bare.marker, f"Sampler:{BASE}") and _engine_cores(bare.marker)):
        assert time.monotonic() < deadline, "no Sampler replica with a vLLM engine core took the killed one's place"
        time.sleep(1)
    wait_ready(bare.url, budget_s=300, done=_up_but_unstartable)
    _stop(bare.process)
    deadline = time.monotonic() + 15
    while (left := _started_by(bare.marker)) and time.monotonic() < deadline:
        time.sleep(0.5)
    survivors = {p: processes.cmdline(p)[:80] for p in left}
    assert not survivors, f"processes outlived the server: {survivors}"
