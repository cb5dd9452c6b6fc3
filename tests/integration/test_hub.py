"""Tokenizers by name from another machine: with HF_ENDPOINT pointing at the server's /hub routes and an empty
Hugging Face cache, `AutoTokenizer.from_pretrained(<served name>)` downloads the base model's tokenizer from us."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
from transformers import AutoTokenizer

from tests.conftest import ROOT, TINY_MODEL
from tests.integration.conftest import BASE_MODEL

TEXT = "hello world, the quick brown fox"


def test_from_pretrained_by_name_through_the_hub_routes(base_url: str, tmp_path: Path) -> None:
    probe = (
        "import json\nfrom transformers import AutoTokenizer\n"
        f"t = AutoTokenizer.from_pretrained({BASE_MODEL!r})\n"
        f"print(json.dumps([t.encode({TEXT!r}), t.eos_token]))"
    )
    env = {
        **os.environ,
        "HF_ENDPOINT": f"{base_url}/hub",
        "HF_HUB_CACHE": str(tmp_path / "empty-cache"),
        "HF_HUB_OFFLINE": "0",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "NO_PROXY": "127.0.0.1,localhost",
    }
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    tokens, eos = json.loads(out.stdout.splitlines()[-1])
    local = AutoTokenizer.from_pretrained(str(TINY_MODEL))
    assert tokens == local.encode(TEXT) and eos == local.eos_token
    downloaded = {p.name for p in (tmp_path / "empty-cache").rglob("*") if p.is_file()}
    assert {"tokenizer.json", "config.json"} <= downloaded


def test_hub_errors_are_the_hubs(base_url: str) -> None:
    with httpx.Client(base_url=f"{base_url}/hub", timeout=10) as http:
        head = http.head(f"/{BASE_MODEL}/resolve/main/config.json")
        assert head.status_code == 200 and len(head.headers["x-repo-commit"]) == 40 and head.headers["etag"]
        commit = head.headers["x-repo-commit"]
        assert http.get(f"/{BASE_MODEL}/resolve/{commit}/config.json").json()["vocab_size"] > 0
        for path, code in (
            (f"/{BASE_MODEL}/resolve/main/model.safetensors", "EntryNotFound"),
            (f"/{BASE_MODEL}/resolve/v9/config.json", "RevisionNotFound"),
            ("/nobody/nothing/resolve/main/config.json", "RepoNotFound"),
            (f"/api/models/{BASE_MODEL}/tree/main/additional_chat_templates", "EntryNotFound"),
        ):
            response = http.get(path)
            assert (response.status_code, response.headers.get("x-error-code")) == (404, code), path
        info = http.get(f"/api/models/{BASE_MODEL}/revision/main").json()
        assert info["sha"] == commit and {"rfilename": "tokenizer.json"} in info["siblings"]
