"""vLLM starts at the context a RoPE scaling gives (app.models.model_config), which it would refuse for YaRN: it
derives a YaRN model's context from max_position_embeddings alone."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from app.models.model_config import model_shape
from app.sampling.engine import LONG_CONTEXT_ENV, allow_scaled_context
from tests.conftest import TINY_MODEL


def test_vllm_takes_the_context_a_yarn_scaling_gives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.config import ModelConfig

    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TINY_MODEL / name, tmp_path / name)
    config = json.loads((tmp_path / "config.json").read_text())
    config["rope_parameters"] = {
        "rope_type": "yarn",
        "factor": 4.0,
        "rope_theta": config["rope_parameters"]["rope_theta"],
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    shape = model_shape(str(tmp_path))
    assert (shape.max_position_embeddings, shape.context_length) == (2048, 8192)
    monkeypatch.setenv(LONG_CONTEXT_ENV, "0")
    monkeypatch.delenv(LONG_CONTEXT_ENV)  # as in a Sampler replica; restored after the test
    with pytest.raises(ValueError, match="greater than the derived max_model_len"):
        ModelConfig(model=str(tmp_path), max_model_len=shape.context_length)
    allow_scaled_context(shape, shape.context_length)
    assert ModelConfig(model=str(tmp_path), max_model_len=shape.context_length).max_model_len == 8192
