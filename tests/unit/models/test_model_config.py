"""model_shape reads the two numbers the builder needs from config.json, as transformers would."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoConfig

from app.models.model_config import ModelShape, model_shape
from tests.conftest import TINY_MODEL


def test_embedded_model_shape_matches_transformers() -> None:
    if not (TINY_MODEL / "config.json").exists():
        pytest.fail("models/tiny is missing: run `make model` first", pytrace=False)
    hf = AutoConfig.from_pretrained(TINY_MODEL)
    assert model_shape(str(TINY_MODEL)) == ModelShape(hf.vocab_size, hf.max_position_embeddings)


def test_multimodal_configs_keep_them_under_text_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"vocab_size": 7, "max_position_embeddings": 9}}))
    assert model_shape(str(tmp_path)) == ModelShape(7, 9)


def test_a_config_without_them_names_the_missing_key(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 7}))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model_shape(str(tmp_path))
