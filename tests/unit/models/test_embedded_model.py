"""The offline-built tiny model: loadable by transformers, a sane tokenizer, byte-identical rebuilds."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import get_args

import pytest

from app.models.embedded import MARKER_FILE, PRESETS, PresetName, build_embedded_model


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_embedded_model("tiny", tmp_path_factory.mktemp("model") / "tiny")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_loads_with_auto_classes(tiny_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    cfg = model.config
    assert cfg.hidden_size // cfg.num_attention_heads == 32
    assert cfg.vocab_size == len(tok)
    assert cfg.tie_word_embeddings
    assert (cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id) == (
        tok.pad_token_id,
        tok.eos_token_id,
        tok.pad_token_id,
    )
    logits = model(**tok("What is 1 + 2?", return_tensors="pt")).logits
    assert logits.shape[-1] == len(tok)


def test_tokenizer_round_trip_and_special_ids(tiny_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    text = "What is 12 + 7? The answer is 19.\nHello, World! ~{}[] tabs\tand  spaces"
    assert tok.decode(tok.encode(text)) == text
    im_start = tok.convert_tokens_to_ids("<|im_start|>")
    ids = {tok.eos_token_id, tok.pad_token_id, im_start}
    assert len(ids) == 3 and all(0 <= i < len(tok) for i in ids)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"


def test_auto_tokenizer_matches_tokenizer_json(tiny_dir: Path) -> None:
    """AutoTokenizer resolves to Qwen2Tokenizer, which rebuilds the pre-tokenizer: ids must still agree."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    raw = Tokenizer.from_file(str(tiny_dir / "tokenizer.json"))
    auto, fast = AutoTokenizer.from_pretrained(tiny_dir), PreTrainedTokenizerFast.from_pretrained(tiny_dir)
    for text in ["What is 12345 + 7? The answer is 12352.", "It's  two\n\nlines", "<|im_start|>user\nhi<|im_end|>"]:
        assert auto.encode(text) == fast.encode(text) == raw.encode(text).ids


def test_chat_template(tiny_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if not isinstance(ids, list) else ids
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>")
    assert tok.eos_token_id in ids


def test_rebuild_is_byte_identical(tiny_dir: Path, tmp_path: Path) -> None:
    other = build_embedded_model("tiny", tmp_path / "again")
    for name in ("model.safetensors", "tokenizer.json"):
        assert _sha256(other / name) == _sha256(tiny_dir / name)


def test_second_build_is_a_no_op(tiny_dir: Path) -> None:
    before = {p.name: p.stat().st_mtime_ns for p in tiny_dir.iterdir()}
    start = time.perf_counter()
    assert build_embedded_model("tiny", tiny_dir) == tiny_dir
    assert time.perf_counter() - start < 0.5
    assert {p.name: p.stat().st_mtime_ns for p in tiny_dir.iterdir()} == before
    assert json.loads((tiny_dir / MARKER_FILE).read_text())["preset"] == "tiny"
    assert not [p for p in tiny_dir.parent.iterdir() if p.name.startswith(".")]  # no temp dirs left


def test_mismatched_marker_is_rebuilt_and_foreign_dir_refused(tmp_path: Path) -> None:
    out = build_embedded_model("tiny", tmp_path / "m", seed=1)
    first = _sha256(out / "model.safetensors")
    build_embedded_model("tiny", out, seed=2)
    assert json.loads((out / MARKER_FILE).read_text())["seed"] == 2
    assert _sha256(out / "model.safetensors") != first
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError):
        build_embedded_model("tiny", foreign)
    with pytest.raises(ValueError):
        build_embedded_model("huge", tmp_path / "x")


def test_the_config_names_every_preset() -> None:
    assert set(get_args(PresetName)) == set(PRESETS)
