"""Register a local model directory in the Hugging Face cache under a repo id, so code that names the model
(`AutoTokenizer.from_pretrained("tinker-serve/tiny")`, the cookbook's `get_tokenizer`) resolves it offline.

The cache layout is the Hub client's own: `models--{org}--{name}/snapshots/{revision}/` holds the files and
`refs/main` names the revision. The revision is a hash of the files, so registering unchanged files is a
no-op and changed ones become a new snapshot that `main` points to.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

# What naming a model resolves: its configuration, its tokenizer and a vision-language model's image and video
# processors (weights stay where the server loads them).
REGISTERED_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                    "special_tokens_map.json", "chat_template.jinja", "preprocessor_config.json",
                    "video_preprocessor_config.json")


def hub_cache_dir() -> Path:
    """The Hugging Face cache the Hub client reads (HF_HUB_CACHE, HF_HOME, or ~/.cache/huggingface/hub)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def registered_files(model_dir: Path) -> list[Path]:
    """The files of `model_dir` that naming the model resolves."""
    return [model_dir / f for f in REGISTERED_FILES if (model_dir / f).is_file()]


def revision(files: list[Path]) -> str:
    """A commit-like id of these files' names and contents (40 hex digits, as Hub revisions are)."""
    digest = hashlib.sha1()
    for path in files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def register(repo_id: str, model_dir: Path, cache_dir: Path | None = None) -> Path:
    """Make `repo_id` (`org/name`, or a bare `name` as the Hub's `gpt2`) resolve to the configuration and tokenizer
    files of `model_dir` in the Hugging Face cache; returns the snapshot directory."""
    parts = repo_id.split("/")
    if len(parts) > 2 or not all(parts):
        raise ValueError(f"a Hub repo id is 'org/name' or 'name', got {repo_id!r}")
    files = registered_files(model_dir)
    if not any(f.name.startswith("tokenizer") for f in files):
        raise FileNotFoundError(f"{model_dir} holds no tokenizer files to register as {repo_id!r}")
    repo = (cache_dir or hub_cache_dir()) / ("models--" + "--".join(parts))
    commit = revision(files)
    snapshot = repo / "snapshots" / commit
    if not snapshot.is_dir():
        (repo / "snapshots").mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{commit}-", dir=repo / "snapshots"))
        for path in files:
            shutil.copyfile(path, staging / path.name)
        try:
            staging.rename(snapshot)  # whole or not at all, also when two processes register at once
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
            if not snapshot.is_dir():
                raise
    (repo / "refs").mkdir(exist_ok=True)
    ref = repo / "refs" / "main"
    if not ref.is_file() or ref.read_text() != commit:
        partial = ref.with_name(f".main-{os.getpid()}")
        partial.write_text(commit)
        partial.replace(ref)
    return snapshot
