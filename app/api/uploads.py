"""Uploading a LoRA adapter trained elsewhere (SDK 0.39+, `UploadURL` headers from 0.40).

external_weights_upload_start checks the base model and LoRA config against what this server trains and samples,
holds the most bytes the files may take against the caller's checkpoint-byte quota, and answers a signed PUT URL per
file of the save_weights_external format (adapter_config.json, adapter_model.safetensors), each with the headers
its PUT must send. On S3 storage the URLs are presigned PUTs to the store; otherwise they are this server's
`PUT /api/v1/uploads/...` route, authorised by an HMAC signature and an expiry in the URL, which streams the body to
storage (off the event loop) and refuses it past the file's bound. external_weights_upload_finish checks the files
(app.api.adapter_files: the config as JSON, the weights by their safetensors header) and makes them a training
checkpoint of the caller's, in a run of its own: loadable by create_training_client_from_state and load_state, and
samplable. Unfinished uploads expire (`expire_uploads`, a sweep); uploads.enabled turns both routes off.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from dataclasses import asdict, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Query, Request, Response

from app.api.adapter_files import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    check_config,
    check_header,
    header_length,
    max_sizes,
)
from app.api.deps import Services, ServicesDep, UserDep
from app.api.models import check_lora_config
from app.api.signatures import sign, signature_valid
from app.config import BaseModelConfig
from app.db.checkpoints import CheckpointRecord
from app.db.metadata import TrainingRun, model_id_for
from app.db.uploads import Upload
from app.errors import BodyTooLarge, Forbidden, LimitExceeded, NotFound, UserError
from app.messages import AdapterSpec
from app.models.adapter_layout import lora_tensors
from app.models.families import family_of
from app.models.model_config import read_model_config
from app.protocol.wire import ExternalWeightsUploadFinishRequest, ExternalWeightsUploadStartRequest
from app.storage.paths import CheckpointPath

router = APIRouter(prefix="/api/v1")
UPLOAD_PREFIX = "/api/v1/uploads/"  # no API key: the signature authorises
CONTENT_TYPE = "application/octet-stream"
SPEC_FILE = "tinker_model.json"  # app.training.checkpoint.SPEC_FILE (that module loads torch)
CHECKPOINT_NAME = "uploaded"


def _enabled(services: Services) -> None:
    if not services.config.uploads.enabled:
        raise Forbidden("uploading adapters is turned off on this server (uploads.enabled)", field="uploads.enabled")


async def _layout(base: BaseModelConfig, spec: AdapterSpec) -> tuple[dict[str, tuple[int, int]], list[str]]:
    """The adapter's tensors (name -> shape) on `base` and its PEFT target modules."""
    config = await asyncio.to_thread(read_model_config, base.path)
    if config is None:
        raise UserError(f"base_model {base.name!r}: its config.json is not readable here", field="base_model")
    try:
        tensors = lora_tensors(config, spec.rank, spec.train_attn, spec.train_mlp)
    except ValueError as exc:
        raise UserError(str(exc), field="base_model") from None
    return tensors, family_of(config["model_type"]).targets(spec.train_attn, spec.train_mlp)[0]


async def _hold(services: Services, upload: Upload) -> None:
    """Record the upload if its bytes fit its owner's checkpoint-byte quota beside what they hold."""
    limit = services.config.quotas.for_user(upload.owner).max_checkpoint_bytes_per_user
    async with services.uploads.admission:
        used = await services.quotas.checkpoint_bytes(upload.owner)
        if used + upload.reserved_bytes > limit:
            raise LimitExceeded(
                f"this upload may hold {upload.reserved_bytes} bytes and your live checkpoints and uploads {used}, "
                f"over quotas.max_checkpoint_bytes_per_user={limit}: delete some checkpoints first",
                field="lora_config",
            )
        await services.uploads.add(upload)


def _sends_headers(request: Request) -> bool:
    """Whether the client reads `urls` as 0.40's `{url, headers}` and sends those headers: any but an SDK before 0.40
    (its X-Stainless-Package-Version), whose `urls` were plain strings PUT with no headers of ours."""
    major, _, rest = request.headers.get("x-stainless-package-version", "").partition(".")
    minor = rest.partition(".")[0]
    return not (major.isdigit() and minor.isdigit()) or (int(major), int(minor)) >= (0, 40)


def _resource(upload_id: str, name: str, any_type: bool) -> str:
    """What a local upload URL's signature covers: the file, and whether its PUT may send any content type."""
    return f"upload/{upload_id}/{name}" + ("\nany-type" if any_type else "")


def _url(services: Services, base_url: str, upload: Upload, name: str, content_type: str | None) -> str:
    """Where to PUT one file (sending `content_type`; None: any): presigned to an S3 store, or this server's signed
    route."""
    ttl_s = max(1, int(upload.expires_at - time.time()))
    presigned = services.storage.presigned_put(upload.location, name, content_type, ttl_s)
    if presigned is not None:
        return presigned
    expires, any_type = int(upload.expires_at), content_type is None
    signature = sign(services.url_signing_key, _resource(upload.upload_id, name, any_type), expires)
    return (
        f"{base_url.rstrip('/')}{UPLOAD_PREFIX}{upload.upload_id}/{name}?expires={expires}"
        f"{'&any_type=true' if any_type else ''}&signature={signature}"
    )


@router.post("/external_weights_upload_start")
async def external_weights_upload_start(
    body: ExternalWeightsUploadStartRequest, request: Request, services: ServicesDep, user: UserDep
) -> dict:
    """Start uploading a LoRA adapter trained elsewhere (SDK 0.39+): a signed PUT URL per file of the PEFT format,
    each with the headers its PUT must send (0.40's `UploadURL`), and when they expire.

    The base model must be served and of a dense family (llama, qwen2, qwen3), the LoRA config one this server trains
    (rank within engine.max_lora_rank); the files' most bytes are held against quotas.max_checkpoint_bytes_per_user
    until the upload is finished or expires (uploads.url_ttl_seconds)."""
    _enabled(services)
    base = services.served_base_model(body.base_model)
    lora = body.lora_config
    check_lora_config(services, lora)
    spec = AdapterSpec(rank=lora.rank, seed=0, train_attn=lora.train_attn, train_mlp=lora.train_mlp)
    tensors, _ = await _layout(base, spec)
    uploads = services.config.uploads
    files = max_sizes(tensors, uploads.max_config_bytes, uploads.max_header_bytes)
    upload = Upload(
        upload_id=f"upload-{secrets.token_hex(16)}",
        owner=user,
        base_model=base.name,
        spec=asdict(spec),
        project_id=body.destination_project_id,
        files=files,
        reserved_bytes=sum(files.values()),
        expires_at=time.time() + uploads.url_ttl_seconds,
        tinker_path=None,
    )
    await _hold(services, upload)
    base_url, headers = str(request.base_url), _sends_headers(request)
    urls: dict[str, Any] = {}
    for name in files:
        url = await asyncio.to_thread(_url, services, base_url, upload, name, CONTENT_TYPE if headers else None)
        urls[name] = {"url": url, "headers": {"Content-Type": CONTENT_TYPE}} if headers else url
    return {
        "upload_id": upload.upload_id,
        "urls": urls,
        "expires": datetime.fromtimestamp(upload.expires_at, UTC).isoformat(),
    }


def _no_upload(upload_id: str) -> NotFound:
    return NotFound(f"no unfinished upload {upload_id!r} (never started, finished or expired)", field="upload_id")


async def _unfinished(services: Services, upload_id: str) -> Upload:
    upload = await services.uploads.find(upload_id)
    if upload is None or upload.tinker_path is not None or upload.expires_at <= time.time():
        raise _no_upload(upload_id)
    return upload


@router.put("/uploads/{upload_id}/{name}")
async def put_file(
    upload_id: str,
    name: str,
    request: Request,
    services: ServicesDep,
    expires: int = Query(...),
    signature: str = Query(...),
    any_type: bool = Query(False),
) -> Response:
    """One file of an upload (a URL from external_weights_upload_start: no API key, its signature authorises it),
    streamed to storage; refused past the most bytes the file may hold."""
    if not signature_valid(services.url_signing_key, _resource(upload_id, name, any_type), expires, signature):
        raise Forbidden("this upload URL is not valid; start the upload again for fresh URLs", field="signature")
    if time.time() > expires:
        raise Forbidden("this upload URL expired; start the upload again", field="expires")
    if not any_type and request.headers.get("content-type") != CONTENT_TYPE:
        raise UserError(
            f"send the header Content-Type: {CONTENT_TYPE}, as external_weights_upload_start's headers for this URL "
            f"say (got {request.headers.get('content-type')!r})",
            field="content-type",
        )
    upload = await _unfinished(services, upload_id)
    cap = upload.files[name]  # the signature covers the name: one of the upload's files
    too_large = BodyTooLarge(f"{name} may hold at most {cap} bytes for this base model and rank", field="body")
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > cap):
        raise too_large
    partial = f"{name}.part"
    stream = await asyncio.to_thread(services.storage.create, upload.location, partial)
    written = 0
    try:
        async for chunk in request.stream():
            written += len(chunk)
            if written > cap:
                raise too_large
            await asyncio.to_thread(stream.write, chunk)
    finally:
        await asyncio.to_thread(stream.close)
    await asyncio.to_thread(services.storage.rename, upload.location, partial, name)
    return Response()


def _read(services: Services, location: str, name: str, offset: int, length: int) -> bytes:
    """`length` bytes of a stored file from `offset` (blocking)."""
    stream = services.storage.open(location, name)
    try:
        stream.read(offset)
        return bytes(stream.read(length))
    finally:
        stream.close()


async def _checked(
    services: Services, upload: Upload, spec: AdapterSpec, tensors: dict[str, tuple[int, int]], targets: list[str]
) -> float:
    """The adapter's lora_alpha, once its files are there, within their bounds, and are the adapter of `tensors` on
    `targets`."""
    try:
        files = await asyncio.to_thread(services.storage.files, upload.location)
        stored = {f.relative_path: f.size_bytes for f in files}
    except FileNotFoundError:
        stored = {}
    for name, cap in upload.files.items():
        if name not in stored:
            raise UserError(f"{name} was not uploaded: PUT it to its URL first", field=f"files.{name}")
        if stored[name] > cap:
            raise LimitExceeded(f"{name} holds {stored[name]} bytes, over its {cap}", field=f"files.{name}")
    config = await asyncio.to_thread(_read, services, upload.location, CONFIG_FILE, 0, stored[CONFIG_FILE])
    alpha = check_config(config, spec.rank, targets)
    size = stored[WEIGHTS_FILE]
    prefix = await asyncio.to_thread(_read, services, upload.location, WEIGHTS_FILE, 0, 8)
    length = header_length(prefix, size, services.config.uploads.max_header_bytes)
    header = await asyncio.to_thread(_read, services, upload.location, WEIGHTS_FILE, 8, length)
    await asyncio.to_thread(check_header, header, size, tensors)
    return alpha


def _peft_config(spec: AdapterSpec, targets: list[str], base: str) -> dict[str, Any]:
    """The adapter_config.json the checkpoint holds (the upload's own is checked, not kept)."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": spec.rank,
        "lora_alpha": spec.alpha,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": targets,
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
    }


def _store(services: Services, upload: Upload, location: str, spec: AdapterSpec, config: dict[str, Any]) -> int:
    """Write the checkpoint's files at `location` (blocking); returns its size in bytes."""

    def build(out: Path) -> None:
        out.mkdir(parents=True)
        (out / CONFIG_FILE).write_text(json.dumps(config, indent=2))
        (out / SPEC_FILE).write_text(json.dumps(asdict(spec), sort_keys=True))
        source = services.storage.open(upload.location, WEIGHTS_FILE)
        try:
            with (out / WEIGHTS_FILE).open("wb") as target:
                while chunk := source.read(1 << 20):
                    target.write(chunk)
        finally:
            source.close()

    return services.storage.write(location, build)


@router.post("/external_weights_upload_finish")
async def external_weights_upload_finish(
    body: ExternalWeightsUploadFinishRequest, services: ServicesDep, user: UserDep
) -> dict:
    """Finish an upload: its files checked (adapter_config.json as JSON, adapter_model.safetensors by its header:
    tensor names, shapes and dtypes; never unpickled) and made a training checkpoint of the caller's, answered as its
    `tinker_path` (load it with create_training_client_from_state or load_state, or sample it)."""
    _enabled(services)
    upload = await services.uploads.find(body.upload_id)
    if upload is not None and upload.owner == user and upload.tinker_path is not None:
        return {"tinker_path": upload.tinker_path}  # a retry
    if upload is None or upload.owner != user or upload.expires_at <= time.time():  # another user's: as missing
        raise _no_upload(body.upload_id)
    base = services.served_base_model(upload.base_model)
    spec = AdapterSpec(**upload.spec)
    tensors, targets = await _layout(base, spec)
    async with services.uploads.finishing:  # one finish at a time on a replica: a concurrent retry waits, then answers
        if (done := await services.uploads.find(upload.upload_id)) and done.tinker_path is not None:
            return {"tinker_path": done.tinker_path}
        alpha = await _checked(services, upload, spec, tensors, targets)
        return {"tinker_path": await _made_checkpoint(services, upload, replace(spec, alpha=alpha), base, targets)}


async def _made_checkpoint(
    services: Services, upload: Upload, spec: AdapterSpec, base: BaseModelConfig, targets: list[str]
) -> str:
    """The checkpoint made of a checked upload, in a run of its own in a new session of the uploader's."""
    user = upload.owner
    session_id = await services.metadata.create_session(
        None, ["external_weights_upload"], {}, project_id=upload.project_id, owner=user
    )
    await services.metadata.finish_session(session_id, "uploaded")
    now = time.time()
    run = TrainingRun(
        model_id=model_id_for(session_id, 0),
        session_id=session_id,
        base_model=base.name,
        lora_rank=spec.rank,
        role=spec.role,
        trainer=base.trainer_for(spec.role),
        lora_config={k: v for k, v in asdict(spec).items() if k != "role"},
        user_metadata={},
        created_at=now,
        unloaded=True,
    )
    await services.metadata.add_training_run(run)
    path = CheckpointPath(run.model_id, "weights", CHECKPOINT_NAME)
    location = path.new_location()
    config = _peft_config(spec, targets, base.name)
    size = await asyncio.to_thread(_store, services, upload, location, spec, config)
    await services.checkpoints.commit(CheckpointRecord(path, location, size, now), overwrite=False)
    await services.uploads.finish(upload.upload_id, path.uri)
    await asyncio.to_thread(services.storage.delete, upload.location)
    await services.audit.record("adapter_uploaded", user, {"tinker_path": path.uri, "base_model": base.name})
    return path.uri


async def expire_uploads(services: Services) -> int:
    """Remove uploads past their expiry: unfinished ones' files, and every such row."""
    expired = await services.uploads.expired(time.time())
    for upload in expired:
        if upload.tinker_path is None:
            await asyncio.to_thread(services.storage.delete, upload.location)
        await services.uploads.remove(upload.upload_id)
    return len(expired)
