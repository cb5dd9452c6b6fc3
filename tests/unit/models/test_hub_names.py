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

from app.models.embedded import PRESETS, build_embedded_model
from tests.conftest import ROOT

# a Hub id -> the tiny preset of its family standing in for it, and the family it must resolve to
NAMES = {
    "meta-llama/Tiny-Llama-3": ("tiny-llama", "llama"),
    "Qwen/Qwen3.5-9B": ("tiny-qwen3_5", "qwen3_5"),
    "deepseek-ai/DeepSeek-V3.1": ("tiny-deepseek-v3", "deepseek_v3"),
    "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B": ("tiny-nemotron-h", "nemotron_h"),
    "moonshotai/Kimi-K2-Instruct": ("tiny-deepseek-v3", "deepseek_v3"),  # its config.json rewritten as Kimi K2's
}
KIMI_CONFIG = {"model_type": "kimi_k2", "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config"}}
PROBE = """
import json, sys
from app.config import ServerConfig
from app.messages import AdapterSpec
from app.training.base_model import load_base_model
from app.training.engine import TrainingEngine
from deployments.builder import served_base_models

loaded = {}
for name in sys.argv[1:]:
    config = ServerConfig.model_validate({"auth": {"mode": "any_tml_key_on_loopback"},
                                         "base_models": [{"name": name, "path": name}]}).resolved()
    limits = served_base_models(config)[1][name]
    base = load_base_model(config.base_models[0].path)
    parameters = sum(p.numel() for p in base.parameters())
    TrainingEngine(base).create_model("m", AdapterSpec(rank=4, seed=0, train_attn=False))
    loaded[name] = {"path": config.base_models[0].path, "arch": limits["arch"], "parameters": parameters}
print(json.dumps(loaded))
"""


def test_bases_named_by_their_hub_ids_load_from_the_local_cache(tmp_path: Path) -> None:
    revision = "0" * 40
    expected, sizes = {}, {}
    for name, (preset, arch) in NAMES.items():
        built = build_embedded_model(preset, tmp_path / "built" / preset)
        repo = tmp_path / "hub" / f"models--{name.replace('/', '--')}"
        shutil.copytree(built, repo / "snapshots" / revision)  # as a download leaves it
        if name.startswith("moonshotai/"):  # Kimi K2 names its own model_type and remote code (never run here)
            config_file = repo / "snapshots" / revision / "config.json"
            config_file.write_text(json.dumps(json.loads(config_file.read_text()) | KIMI_CONFIG))
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(revision)
        expected[name] = {"path": name, "arch": arch}
        sizes[name] = json.loads((built / "tinker_serve_model.json").read_text())["num_parameters"]
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *NAMES], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    loaded = json.loads(out.stdout.splitlines()[-1])
    assert {name: {k: v for k, v in got.items() if k != "parameters"} for name, got in loaded.items()} == expected
    for name, (preset, _) in NAMES.items():
        if PRESETS[preset].vision is None:
            assert loaded[name]["parameters"] == sizes[name], name
        else:  # the trainer loads the language model alone, not the vision tower beside it
            assert 0 < loaded[name]["parameters"] < sizes[name], name
