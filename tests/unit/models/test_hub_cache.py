"""Registering a model under a Hub repo id in a Hugging Face cache: `AutoTokenizer.from_pretrained(name)` then
resolves offline, in a fresh interpreter, to the same tokenizer as the directory; re-registering is a no-op and
changed files become a new snapshot."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app.models.hub_cache import register
from tests.conftest import ROOT, TINY_MODEL

TEXT = "hello world, the quick brown fox"


def _encode_by_name(cache: Path, name: str) -> list[int]:
    probe = (
        "import json\nfrom transformers import AutoTokenizer\n"
        f"print(json.dumps(AutoTokenizer.from_pretrained({name!r}).encode({TEXT!r})))"
    )
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def tiny_dir() -> Path:
    from app.models.embedded import build_embedded_model

    return build_embedded_model("tiny", TINY_MODEL)


def test_a_registered_name_resolves_offline_to_the_same_tokenizer(tiny_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    cache = tmp_path / "hub"
    with pytest.raises(AssertionError):  # nothing registered yet: the name does not resolve offline
        _encode_by_name(cache, "tinker-serve/tiny")
    snapshot = register("tinker-serve/tiny", tiny_dir, cache)
    assert snapshot.parent.parent == cache / "models--tinker-serve--tiny"
    assert _encode_by_name(cache, "tinker-serve/tiny") == AutoTokenizer.from_pretrained(str(tiny_dir)).encode(TEXT)
    assert not (snapshot / "model.safetensors").exists()  # names resolve config and tokenizer, not weights


def test_reregistering_is_a_no_op_and_changed_files_move_main(tiny_dir: Path, tmp_path: Path) -> None:
    cache, model = tmp_path / "hub", tmp_path / "model"
    shutil.copytree(tiny_dir, model)
    first = register("org/m", model, cache)
    assert register("org/m", model, cache) == first
    config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 77}))
    second = register("org/m", model, cache)
    assert second != first and first.is_dir()
    assert (cache / "models--org--m" / "refs" / "main").read_text() == second.name
    assert json.loads((second / "tokenizer_config.json").read_text())["model_max_length"] == 77


def test_a_name_without_an_org_resolves_as_the_hubs_own_do(tiny_dir: Path, tmp_path: Path) -> None:
    """A base served as `tiny` (the Hub's `gpt2` form) is cached as `models--tiny`, where naming it looks."""
    from transformers import AutoTokenizer

    cache = tmp_path / "hub"
    assert register("tiny", tiny_dir, cache).parent.parent == cache / "models--tiny"
    assert _encode_by_name(cache, "tiny") == AutoTokenizer.from_pretrained(str(tiny_dir)).encode(TEXT)


@pytest.mark.parametrize("name", ["a/b/c", "/tiny", "org/", ""])
def test_a_name_that_is_not_a_hub_repo_id_is_refused(tiny_dir: Path, tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match="org/name"):
        register(name, tiny_dir, tmp_path)


def test_a_directory_without_a_tokenizer_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="no tokenizer"):
        register("org/m", tmp_path, tmp_path / "hub")
