"""Worker-group settings left at auto follow the base: the embedded tiny model replicates and keeps its activations,
a 0.6B-shaped one shards and recomputes them, an unknown one gets the real-model settings; set values stay."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from app.config import WorkerGroupConfig
from app.trainer.model_defaults import for_model, weight_bytes
from tests.conftest import ROOT, TINY_MODEL


@pytest.fixture
def tiny() -> Path:
    from app.models.embedded import build_embedded_model

    return build_embedded_model("tiny", TINY_MODEL)


@pytest.fixture
def qwen3_0_6b_shaped(tmp_path: Path) -> Path:
    """The 0.6B preset's config beside a sparse weight file of its size (nothing is loaded)."""
    from app.models.embedded import PRESETS

    preset = PRESETS["qwen3-0.6b"]
    config = {"model_type": "qwen3", "vocab_size": 2048, "hidden_size": preset.hidden_size,
              "num_hidden_layers": preset.num_hidden_layers, "num_attention_heads": preset.num_attention_heads,
              "num_key_value_heads": preset.num_key_value_heads, "head_dim": preset.head_dim,
              "intermediate_size": preset.intermediate_size, "max_position_embeddings": 40960}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    with (tmp_path / "model.safetensors").open("wb") as f:
        os.truncate(f.fileno(), 885_164_256)
    return tmp_path


def test_a_tiny_base_replicates_and_keeps_its_activations(tiny: Path) -> None:
    resolved, reasons = for_model(WorkerGroupConfig(dtype="float32"), str(tiny))
    assert (resolved.sharding, resolved.activation_checkpointing) == ("replicate", False)
    assert not resolved.shards_base() and not resolved.recomputes_activations()
    assert len(reasons) == 2 and "weights 2 MiB" in reasons[0], reasons


def test_a_real_sized_base_shards_and_recomputes(qwen3_0_6b_shaped: Path) -> None:
    resolved, reasons = for_model(WorkerGroupConfig(dtype="bfloat16"), str(qwen3_0_6b_shaped))
    assert (resolved.sharding, resolved.activation_checkpointing) == ("fsdp", True)
    assert "weights 844 MiB" in reasons[0] and "~20.1 GiB" in reasons[1], reasons


def test_an_unknown_base_gets_the_real_model_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert weight_bytes("nobody/nothing") is None
    resolved, _ = for_model(WorkerGroupConfig(), "nobody/nothing")
    assert (resolved.sharding, resolved.activation_checkpointing) == ("fsdp", True)
    unresolved = WorkerGroupConfig()  # a group built without the builder reads auto as the real-model settings
    assert unresolved.shards_base() and unresolved.recomputes_activations()


def test_set_values_stay_and_resolving_twice_changes_nothing(tiny: Path) -> None:
    chosen = WorkerGroupConfig(sharding="fsdp", activation_checkpointing=True)
    assert for_model(chosen, str(tiny)) == (chosen, [])
    once, _ = for_model(WorkerGroupConfig(), str(tiny))
    assert for_model(once, str(tiny)) == (once, [])


def test_the_embedded_config_names_no_settings_of_the_tiny_model() -> None:
    """serve_config.yaml leaves them to auto, so swapping `path` for a real model needs no other change."""
    import yaml

    (app,) = yaml.safe_load((ROOT / "serve_config.yaml").read_text())["applications"]
    trainer = app["args"]["base_models"][0]["trainer"]
    assert "sharding" not in trainer and "activation_checkpointing" not in trainer


def test_a_hub_snapshot_counts_its_weight_files(tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    snapshot = tmp_path / "hub" / "models--org--m" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copyfile(tiny / name, snapshot / name)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0" * 40)
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))  # read at each lookup
    assert weight_bytes("org/m") == (tiny / "model.safetensors").stat().st_size
