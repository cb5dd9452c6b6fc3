"""`serve run serve_config.yaml` as a Ray user types it, with none of `make serve`'s Serve settings: the embedded
config (only its state directory and proxy port moved) serves the Tinker API through Serve's proxy and says so once;
the real SDK trains and samples through it; stopped as a supervisor stops it (SIGTERM to its process group, SIGKILL
after a grace period) after its Sampler replica was killed and replaced, no process it started survives, vLLM's
engine cores included. Its own Ray instance (`serve run
--address local` under a Ray temp dir of its own), before the shared one starts."""

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
from tests.conftest import ROOT, TINY_MODEL, free_port
from tests.integration.helpers import sft_datums

GRACE_S = 30  # SIGTERM, then SIGKILL this much later
SERVE_SETTINGS = {*serve_env.single_node(0), *serve_env.CLUSTER}


def _started_by(marker: str) -> list[int]:
    """The processes whose environment holds `marker` (every process of the Ray instance inherits its temp dir)."""
    pids = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if marker.encode() in environ.read_bytes().split(b"\0") and not _zombie(int(environ.parent.name)):
                pids.append(int(environ.parent.name))
        except (OSError, ValueError):  # gone meanwhile, or not ours to read
            continue
    return pids


def _zombie(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"


@dataclass
class BareServer:
    url: str  # Serve's proxy
    log: Path
    marker: str  # in the environment of every process it starts
    process: subprocess.Popen[bytes]  # `serve run`, leading a process group of its own


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
        _wait_ready(f"http://127.0.0.1:{port}", server, log)
        yield BareServer(f"http://127.0.0.1:{port}", log, marker, server)
    finally:
        _stop(server)
        shutil.rmtree(ray_tmp, ignore_errors=True)


def _wait_ready(url: str, server: subprocess.Popen[bytes], log: Path, budget_s: float = 420) -> None:
    """Until /ready answers 200, failing at once, with the end of its log, if `serve run` exits."""
    deadline = time.monotonic() + budget_s
    while True:
        assert server.poll() is None, (
            f"serve run exited {server.returncode}:\n{log.read_text(errors='replace')[-3000:]}"
        )
        if _ready(url):
            return
        assert time.monotonic() < deadline, (
            f"not ready within {budget_s:g} s:\n{log.read_text(errors='replace')[-3000:]}"
        )
        time.sleep(1)


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
    client = tinker.ServiceClient(base_url=bare.url, api_key="tml-bare-serve-run")
    tc = client.create_lora_training_client(base_model="tinker-serve/tiny", rank=8, seed=5).result()
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


def _engine_cores(marker: str) -> list[int]:
    return [p for p in _started_by(marker) if b"EngineCore" in Path(f"/proc/{p}/cmdline").read_bytes()]


def _replicas(marker: str, deployment: str) -> list[int]:
    return [p for p in _started_by(marker) if f"ServeReplica:tinker:{deployment}".encode() in _cmdline(p)]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_stopping_it_leaves_no_process_behind(bare: BareServer) -> None:
    """Runs last in the module: it stops the server. First the Sampler replica is SIGKILLed and Serve replaces it
    (outside `serve run`'s process group, so the stop's signals never reach it); then the server is stopped as a
    supervisor does. Ray's own processes share its fate, and vLLM's engine cores, children of Sampler replicas, must
    too: the replacement's was left an orphan before app.sampling.engine_core_guard."""
    (replica,) = _replicas(bare.marker, "Sampler")
    os.kill(replica, signal.SIGKILL)
    deadline = time.monotonic() + 300
    while not (_replicas(bare.marker, "Sampler") and _engine_cores(bare.marker)) or not _ready(bare.url):
        assert time.monotonic() < deadline, "no Sampler replica took the killed one's place"
        time.sleep(1)
    assert _engine_cores(bare.marker), "the replacement replica runs no vLLM engine core"
    _stop(bare.process)
    deadline = time.monotonic() + 15
    while (left := _started_by(bare.marker)) and time.monotonic() < deadline:
        time.sleep(0.5)
    survivors = {p: _cmdline(p)[:80] for p in left}
    assert not survivors, f"processes outlived the server: {survivors}"


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/ready", timeout=10).status_code == 200
    except (httpx.TimeoutException, httpx.ConnectError):
        return False
