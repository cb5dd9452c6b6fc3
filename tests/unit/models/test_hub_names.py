"""A base named by its Hub id (`path: org/name`), its files already in the local Hugging Face cache, loads offline: the
app builder reads its family and size, and the trainer loads it and adapts it, in a fresh interpreter whose cache is
that one (as a server's is)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from app.models.embedded import build_embedded_model
from tests.conftest import ROOT

NAME = "meta-llama/Tiny-Llama-3"
PROBE = """
import json, sys
from app.config import ServerConfig
from app.messages import AdapterSpec
from app.training.base_model import load_base_model
from app.training.engine import TrainingEngine
from deployments.builder import _model_limits

name = sys.argv[1]
config = ServerConfig.model_validate({"auth": {"mode": "any_tml_key_on_loopback"},
                                     "base_models": [{"name": name, "path": name}]}).resolved()
limits = _model_limits(config)[name]
base = load_base_model(config.base_models[0].path)
parameters = sum(p.numel() for p in base.parameters())
TrainingEngine(base).create_model("m", AdapterSpec(rank=4, seed=0, train_attn=False))
print(json.dumps({"path": config.base_models[0].path, "arch": limits["arch"], "parameters": parameters}))
"""


def test_a_base_named_by_its_hub_id_loads_from_the_local_cache(tmp_path: Path) -> None:
    built = build_embedded_model("tiny-llama", tmp_path / "built")
    revision = "0" * 40
    repo = tmp_path / "hub" / f"models--{NAME.replace('/', '--')}"
    shutil.copytree(built, repo / "snapshots" / revision)  # as a download leaves it
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, NAME], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    loaded = json.loads(out.stdout.splitlines()[-1])
    marker = json.loads((built / "tinker_serve_model.json").read_text())
    assert loaded == {"path": NAME, "arch": "llama", "parameters": marker["num_parameters"]}
