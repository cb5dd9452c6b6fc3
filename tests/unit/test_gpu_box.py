"""The GPU-box profile (deployments/gpu_box.py, deploy/serve_config.one-gpu.yaml) and what `make serve` does with it:
the profile builds the app as `serve run` would, the N-GPU split reserves whole GPUs within the box, and the one-GPU
profile's placement (the trainer's worker-group bundles and the Sampler's actor options, from the code the deployments
use) is accepted together on a Ray node that declares one GPU, and refused when the shares sum above it.

Ray starts once for the module (address="local", a node of 4 CPUs and one declared GPU: Ray only does the
accounting); on the shared 2-core machine ray.init took 5-18 s."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

import deployments.builder
from app.config import ServerConfig
from deployments import gpu_box
from deployments.builder import _with_model_defaults
from deployments.ingress import Ingress
from deployments.sampler import Sampler
from deployments.trainer import Trainer
from tests.conftest import ROOT

ONE_GPU_PROFILE = ROOT / "deploy" / "serve_config.one-gpu.yaml"
# Qwen/Qwen3-0.6B's config.json, what the build step reads of it (the weights are not needed to build)
QWEN3_0_6B = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "rope_theta": 1000000,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}


def _args(text: str) -> dict[str, Any]:
    (app,) = yaml.safe_load(text)["applications"]
    assert app["import_path"] == "deployments.builder:build_app"
    return app["args"]


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A Hugging Face cache holding Qwen/Qwen3-0.6B's config.json, read offline."""
    import huggingface_hub.constants

    commit = "0" * 40
    repo = tmp_path / "hub" / "models--Qwen--Qwen3-0.6B"
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "config.json").write_text(json.dumps(QWEN3_0_6B))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return tmp_path / "hub"


def test_the_committed_one_gpu_profile_is_the_rendering() -> None:
    assert ONE_GPU_PROFILE.read_text() == gpu_box.profile_text(gpu_box.DEFAULT_MODEL, 1), (
        "deploy/serve_config.one-gpu.yaml is stale: run `python -m deployments.gpu_box --gpus 1 "
        "--out deploy/serve_config.one-gpu.yaml`"
    )


def test_the_one_gpu_profile_builds_the_app(hub_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What `serve run` does with it: build_app validates, reads the model's config and binds every deployment."""
    monkeypatch.setattr(deployments.builder, "route_app_logs", lambda: None)
    args = _args(ONE_GPU_PROFILE.read_text())
    app = deployments.builder.build_app(args)
    assert type(app).__name__ == "Application"
    (base,) = ServerConfig.model_validate(args).base_models
    assert base.name == base.path == "Qwen/Qwen3-0.6B" and base.max_context_length == gpu_box.ONE_GPU_CONTEXT
    assert base.shares_a_gpu() and base.sampler_starts_after_trainer(cores=64)  # vLLM profiles memory after the trainer
    assert base.trainer.gpu_memory_fraction + base.sampler.gpu_memory_utilization <= 1
    assert base.sampler_dtype() == "bfloat16"


@pytest.mark.parametrize("gpus", [1, 2, 3, 4, 8])
def test_each_split_validates_and_reserves_at_most_the_box(gpus: int) -> None:
    s = gpu_box.split(gpus)
    assert 0 < s.gpus <= gpus and s.trainer_workers >= 1 and s.sampler_replicas >= 1
    config = ServerConfig.model_validate(_args(gpu_box.profile_text("org/model", gpus)))
    (base,) = config.base_models
    assert base.trainer.num_workers == s.trainer_workers and base.sampler.max_replicas == s.sampler_replicas
    if gpus == 1:
        assert base.shares_a_gpu() and s.gpus == 1
    else:  # whole GPUs: floor(N/2) train, the rest sample
        assert (s.trainer_workers, s.sampler_replicas) == (gpus // 2, gpus - gpus // 2) and s.gpus == gpus
        assert base.trainer.gpus_per_worker == base.sampler.num_gpus == 1 and not base.shares_a_gpu()
        assert base.max_context_length is None  # the model's whole context
    with pytest.raises(ValueError, match="at least one GPU"):
        gpu_box.split(0)


def test_a_local_model_directory_is_served_by_its_name(tmp_path: Path) -> None:
    model = tmp_path / "my-model"
    model.mkdir()
    (base,) = ServerConfig.model_validate(_args(gpu_box.profile_text(str(model), 1))).base_models
    assert (base.name, base.path) == ("my-model", str(model))


def test_visible_gpus() -> None:
    assert gpu_box.visible_gpus({"CUDA_VISIBLE_DEVICES": "0,1"}) == 2
    assert gpu_box.visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == 0
    assert gpu_box.visible_gpus({"CUDA_VISIBLE_DEVICES": "-1"}) == 0


def test_the_cli_writes_the_profile_and_refuses_no_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "state" / "box.yaml"
    assert gpu_box.main(["--gpus", "2", "--model", "org/model", "--out", str(out)]) == 0
    assert out.read_text() == gpu_box.profile_text("org/model", 2)
    assert gpu_box.main(["--gpus", "0"]) == 2
    assert "no NVIDIA GPU found" in capsys.readouterr().err


# --- placement on a Ray node that declares one GPU --------------------------------------------------------------


def _bundle(ray_actor_options: dict[str, Any]) -> dict[str, float]:
    """What an actor with these options reserves on its node (Serve replicas are actors)."""
    wanted = {
        "CPU": ray_actor_options.get("num_cpus", 0),
        "GPU": ray_actor_options.get("num_gpus", 0),
        **ray_actor_options.get("resources", {}),
    }
    return {name: float(amount) for name, amount in wanted.items() if amount}


def _reservations(config: ServerConfig) -> list[dict[str, float]]:
    """Everything the app reserves at once, by the deployments' own code: each Trainer replica and its worker group's
    placement group (the bundles Ray Train asks for), the Sampler's replicas at their most, the ingress replicas."""
    from app.trainer.worker_group import worker_bundles

    bundles = []
    for base in config.base_models:
        for name, group in base.trainer_groups().items():
            bundles.append(_bundle(Trainer.deployment_options(config, name)["ray_actor_options"]))
            bundles += worker_bundles(group)
        options = Sampler.deployment_options(config, base.name)
        bundles += [_bundle(options["ray_actor_options"])] * options["autoscaling_config"]["max_replicas"]
    ingress = Ingress.deployment_options(config)
    bundles += [_bundle(ingress["ray_actor_options"])] * ingress["num_replicas"]
    return [bundle for bundle in bundles if bundle]


# Run in a process of its own: the suite's own Ray (the integration tests' shared instance) may already be connected
# here, and it declares no GPU. Its output's last line: whether each set of bundles was reserved together. Each
# placement group is waited on until Ray places it or declares it infeasible (no node can ever hold it): an event,
# not a timer.
PLACE = """
import json, sys, tempfile, time, ray
from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group
ray.init(address="local", num_cpus=4, num_gpus=1, include_dashboard=False, logging_level="WARNING",
         _temp_dir=tempfile.mkdtemp(prefix="tsgpu-", dir="/tmp"))  # short: Ray's socket paths have a length limit
placed = []
for bundles in json.loads(sys.argv[1]):
    pg = placement_group(bundles, strategy="STRICT_PACK")
    deadline = time.monotonic() + 60
    while (table := placement_group_table(pg))["state"] != "CREATED":
        if table["stats"]["scheduling_state"] == "INFEASIBLE" or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    placed.append(table["state"] == "CREATED")
    remove_placement_group(pg)
ray.shutdown()
print(json.dumps(placed))
"""


def _placed_on_a_one_gpu_node(cases: list[list[dict[str, float]]]) -> list[bool]:
    """For each set of bundles, whether a fresh Ray node with 4 CPUs and one GPU reserves all of them together
    (STRICT_PACK), one set after the other."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run(
        [sys.executable, "-c", PLACE, json.dumps(cases)], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _one_gpu_config() -> ServerConfig:
    return _with_model_defaults(ServerConfig.model_validate(_args(ONE_GPU_PROFILE.read_text())).resolved())


def test_the_one_gpu_profile_is_placed_on_a_one_gpu_node_and_more_than_one_gpu_is_not() -> None:
    config = _one_gpu_config()
    bundles = _reservations(config)
    assert sorted(b.get("GPU", 0) for b in bundles if "GPU" in b) == [0.5, 0.5]  # the trainer's rank, the sampler
    (base,) = config.base_models
    greedy = base.model_copy(update={"sampler": base.sampler.model_copy(update={"num_gpus": 0.6})})
    too_much = _reservations(config.model_copy(update={"base_models": [greedy]}))
    assert sum(b.get("GPU", 0) for b in too_much) == pytest.approx(1.1)
    # the profile fits; 1.1 GPUs do not; and what was refused was the excess, not the node
    assert _placed_on_a_one_gpu_node([bundles, too_much, bundles]) == [True, False, True]


# --- make serve -------------------------------------------------------------------------------------------------


def _make_serve(tmp_path: Path, *args: str, nvidia_smi_rc: int | None = None) -> str:
    """`make -n serve ARGS` (prints, runs nothing), with a stand-in nvidia-smi that exits `nvidia_smi_rc` (None: no
    nvidia-smi on PATH) and no GPU, MODEL or GPUS in the environment."""
    bin_dir = Path(tempfile.mkdtemp(prefix="bin-", dir=tmp_path))  # PATH: these tools only
    for tool in ("make", "sh", "bash"):
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    if nvidia_smi_rc is not None:
        fake = bin_dir / "nvidia-smi"
        fake.write_text(f"#!/bin/sh\necho 'GPU 0: Fake (UUID: GPU-0)'\nexit {nvidia_smi_rc}\n")
        fake.chmod(0o755)
    drop = {"GPU", "MODEL", "GPUS", "MAKEFLAGS", "MFLAGS", "MAKELEVEL"}
    env = {k: v for k, v in os.environ.items() if k not in drop} | {"PATH": str(bin_dir)}
    result = subprocess.run(
        ["make", "-n", "serve", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_make_serve_on_a_gpu_machine_serves_the_gpu_box(tmp_path: Path) -> None:
    for out in (
        _make_serve(tmp_path, nvidia_smi_rc=0),  # nvidia-smi lists a GPU
        _make_serve(tmp_path, "GPU=1"),  # asked for, without one
    ):
        assert "setup GPU=1" in out
        assert f'deployments.gpu_box --model "{gpu_box.DEFAULT_MODEL}"' in out and "--download" in out
        assert "deployments.serve_env --port 8000" in out and "serve run state/serve_config.gpu-box.yaml" in out
        assert "app.models.embedded" not in out
    out = _make_serve(tmp_path, "GPU=1", "MODEL=Qwen/Qwen3-8B", "GPUS=2")
    assert 'deployments.gpu_box --model "Qwen/Qwen3-8B" --gpus 2 --download' in out


def test_make_serve_elsewhere_serves_the_cpu_default(tmp_path: Path) -> None:
    for out in (
        _make_serve(tmp_path),  # no nvidia-smi
        _make_serve(tmp_path, nvidia_smi_rc=9),  # nvidia-smi finds no GPU / driver
        _make_serve(tmp_path, "GPU=0", nvidia_smi_rc=0),  # a GPU, declined
    ):
        assert "serve run serve_config.yaml" in out and "app.models.embedded --preset tiny" in out
        assert "deployments.gpu_box" not in out and "setup GPU=1" not in out
