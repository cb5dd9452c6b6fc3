"""The small read-only part of the Hugging Face Hub's HTTP API that `from_pretrained` uses, for the served base
models' configuration and tokenizer files: a client on another machine sets `HF_ENDPOINT=http://<server>:8000/hub`
and resolves a tokenizer by the model's served name (`AutoTokenizer.from_pretrained("tinker-serve/tiny")`).

Routes: file resolve (HEAD and GET, with the headers the Hub client reads: X-Repo-Commit, ETag, Content-Length),
model info by revision, and a repo tree listing. Missing things answer 404 with the Hub's X-Error-Code, which
the client turns into its own RepositoryNotFound / RevisionNotFound / EntryNotFound errors.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass
from pathlib import Path

from fastapi import APIRouter, Request, Response

from app.api.deps import Services, ServicesDep
from app.caches import remember
from app.errors import NotFound
from app.models.hub_cache import REGISTERED_FILES, registered_files, revision

HUB_PREFIX = "/hub"
router = APIRouter(prefix=HUB_PREFIX)


class HubNotFound(NotFound):
    """A 404 the Hub client understands: `code` is RepoNotFound, RevisionNotFound or EntryNotFound."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code

    def headers(self) -> dict[str, str]:
        return {"x-error-code": self.code}


@dataclass(frozen=True)
class HubFile:
    path: Path
    sha256: str
    size: int


@dataclass(frozen=True)
class HubRepo:
    repo_id: str
    commit: str
    files: dict[str, HubFile]  # by name


Stats = tuple[tuple[str, int, int], ...]  # (path, mtime_ns, size) of each file
_read: dict[tuple[str, Path], tuple[Stats, HubRepo]] = {}  # (repo id, directory) -> its files' stats and contents


def _read_repo(repo_id: str, directory: Path) -> HubRepo:
    """The repo of `directory`'s files, read and hashed again only when a file's path, mtime or size changed (a
    listing or a resolve costs a stat per file, not a read and two hashes of every file)."""
    files = registered_files(directory)
    stats = tuple((str(f), (st := f.stat()).st_mtime_ns, st.st_size) for f in files)
    cached = _read.get((repo_id, directory))
    if cached is not None and cached[0] == stats:
        return cached[1]
    hashed = {
        f.name: HubFile(f, hashlib.sha256(f.read_bytes()).hexdigest(), size) for f, (_, _, size) in zip(files, stats)
    }
    repo = HubRepo(repo_id, revision(files), hashed)
    return remember(_read, (repo_id, directory), (stats, repo), limit=1024)[1]


def _model_directory(path: str) -> Path | None:
    """A base model's files on this machine: its directory, or the server's own Hugging Face cache of it."""
    if Path(path).is_dir():
        return Path(path)
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(path, local_files_only=True, allow_patterns=list(REGISTERED_FILES)))
    except Exception:  # noqa: BLE001 - the Hub client raises several kinds for "not in the cache"
        return None


async def _repo(services: Services, repo_id: str, revision_asked: str | None = None) -> HubRepo:
    """A served base's repo by its name: `org/name`, or a bare `name` as the Hub's `gpt2`."""
    base = services.config.base_model(repo_id)
    directory = await asyncio.to_thread(_model_directory, base.path) if base else None
    if directory is None:
        served = [m.name for m in services.config.base_models]
        raise HubNotFound(
            f"{repo_id!r} is not a base model with files on this server; served: {served}", "RepoNotFound"
        )
    repo = await asyncio.to_thread(_read_repo, repo_id, directory)
    if revision_asked not in (None, "main", repo.commit):
        raise HubNotFound(f"{repo_id!r} has only the revision 'main' ({repo.commit})", "RevisionNotFound")
    return repo


@router.api_route("/{repo_id:path}/resolve/{revision_asked}/{filename:path}", methods=["GET", "HEAD"])
async def resolve(
    repo_id: str, revision_asked: str, filename: str, request: Request, services: ServicesDep
) -> Response:
    repo = await _repo(services, repo_id, revision_asked)
    if filename not in repo.files:
        raise HubNotFound(f"{repo.repo_id!r} serves only {sorted(repo.files)}, not {filename!r}", "EntryNotFound")
    file = repo.files[filename]
    body = b"" if request.method == "HEAD" else await asyncio.to_thread(file.path.read_bytes)
    size = file.size if request.method == "HEAD" else len(body)
    headers = {"x-repo-commit": repo.commit, "etag": f'"{file.sha256}"', "content-length": str(size)}
    return Response(body, headers=headers, media_type="application/octet-stream")


def _info(repo: HubRepo) -> dict:
    return {
        "id": repo.repo_id,
        "modelId": repo.repo_id,
        "sha": repo.commit,
        "private": False,
        "gated": False,
        "disabled": False,
        "siblings": [{"rfilename": name} for name in sorted(repo.files)],
    }


# A repo id may hold a slash, so each route's literal parts after it pick it out; the bare info route comes last.
@router.get("/api/models/{repo_id:path}/revision/{revision_asked}")
async def model_info_at(repo_id: str, revision_asked: str, services: ServicesDep) -> dict:
    return _info(await _repo(services, repo_id, revision_asked))


@router.get("/api/models/{repo_id:path}/tree/{revision_asked}")
@router.get("/api/models/{repo_id:path}/tree/{revision_asked}/{path:path}")
async def tree(repo_id: str, revision_asked: str, services: ServicesDep, path: str = "") -> list[dict]:
    """The repo is flat: its root lists the files; any folder (e.g. additional_chat_templates) does not exist."""
    repo = await _repo(services, repo_id, revision_asked)
    if path.strip("/"):
        raise HubNotFound(f"{repo.repo_id!r} has no folder {path!r}", "EntryNotFound")
    return [{"type": "file", "path": name, "size": f.size, "oid": f.sha256} for name, f in sorted(repo.files.items())]


@router.get("/api/models/{repo_id:path}")
async def model_info(repo_id: str, services: ServicesDep) -> dict:
    return _info(await _repo(services, repo_id))
