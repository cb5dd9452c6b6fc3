"""JSON request bodies of the Tinker endpoints, named after `tinker.types`.

Request models ignore unknown fields and treat absent and null alike, so newer SDKs keep working.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.protocol.field_limits import Limit

__all__ = [
    "INT64_MAX",
    "AdamParams",
    "CancelFutureRequest",
    "CreateCustomLossRequest",
    "CreateModelRequest",
    "CreateSamplingSessionRequest",
    "CreateSessionRequest",
    "DimuonParams",
    "FinishSessionRequest",
    "GetInfoRequest",
    "JoinSamplingSessionRequest",
    "LoraConfig",
    "OptimStepRequest",
    "RetrieveFutureRequest",
    "RetrieveFuturesRequest",
    "SampleRequest",
    "SamplingParams",
    "SaveWeightsForSamplerRequest",
    "SessionHeartbeatRequest",
    "UnloadModelRequest",
]


INT64_MAX = 2**63 - 1  # ids, cursors and TTLs are stored as 64-bit database integers
MAX_PROJECT_IDS = 1000  # a session search's project_ids: one SQL parameter each
# strings stored in bounded database columns (app.db.schema): longer ones are refused naming their field
ProjectId = Annotated[str, Field(max_length=200)]
Name = Annotated[str, Field(max_length=200)]
Id = Annotated[str, Field(max_length=200)]  # a session, model, sampler or request id: its column is at most this wide
TinkerPath = Annotated[str, Field(max_length=400)]  # tinker://{model_id}/{kind}/{name}, stored in String(400) columns
# integers checked against the limits (or a vocabulary) by their handlers: first refused outside 64 bits, as the
# engines and the database take them
Int64 = Annotated[int, Field(ge=-(2**63), le=INT64_MAX)]
Seed = Annotated[int, Field(ge=-(2**63), le=2**64 - 1)]  # what torch.manual_seed takes; the SDK sends any 64 bits
Metadata = Annotated[dict[str, Any], Limit("max_user_metadata_bytes", "json_bytes")]
# a few numbers ({type, version} or Adam's six): 4 KiB is far beyond any real one
OptimizerParams = Annotated[dict[str, Any], Limit(4096, "json_bytes")]
# a sampling stop: a string, strings or token ids (each list no longer than limits.max_stop_sequences), its strings
# no longer than limits.max_stop_chars together: the sampler compares each with the text after every token
Stop = Annotated[
    str | list[str] | list[Int64],
    Limit("max_stop_sequences", "items"),
    Limit("max_stop_chars", "total_chars"),
]


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())


class CreateSessionRequest(_Lenient):
    """`tags` and `user_metadata` are each bounded by limits.max_user_metadata_bytes as JSON."""

    tags: Annotated[list[str], Limit("max_user_metadata_bytes", "json_bytes")] = Field(default_factory=list)
    user_metadata: Metadata | None = None
    sdk_version: str | None = Field(None, max_length=32)
    project_id: ProjectId | None = None
    display_name: str | None = Field(None, max_length=400)


class SessionHeartbeatRequest(_Lenient):
    session_id: Id


class FinishReason(_Lenient):
    type: str | None = Field(None, max_length=32)  # success | errored | interrupted


class FinishSessionRequest(_Lenient):
    reason: FinishReason | None = None
    # read by no one (the SDK sends what close(detail=...) got, a traceback maybe): only the body's cap bounds it
    detail: Annotated[str, Limit("max_control_request_bytes", "chars")] | None = None


class LoraConfig(_Lenient):
    rank: int = Field(32, ge=1, le=INT64_MAX)  # then engine.max_lora_rank (app.api.models)
    seed: Seed | None = None
    train_unembed: bool = True
    train_mlp: bool = True
    train_attn: bool = True


class CreateModelRequest(_Lenient):
    session_id: Id
    model_seq_id: int = Field(ge=0, le=INT64_MAX)
    base_model: Name
    lora_config: LoraConfig = Field(default_factory=LoraConfig)
    optimizer_config: OptimizerParams | None = None
    user_metadata: Metadata | None = None
    # "policy" or "critic" (SkyRL's field); or user_metadata["model_role"]
    model_role: str | None = Field(None, max_length=16)


class CreateCustomLossRequest(_Lenient):
    """A traced loss; `inputs` and `graph` are checked node by node in app.training_data.custom_losses."""

    session_id: Id
    custom_loss_seq_id: int = Field(ge=0, le=INT64_MAX)
    name: Name
    inputs: list[Any]
    graph: dict[str, Any]


class GetInfoRequest(_Lenient):
    model_id: Id


class UnloadModelRequest(_Lenient):
    model_id: Id


class AdamParams(_Lenient):
    learning_rate: float = Field(1e-4, ge=0)
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.95, ge=0, lt=1)
    eps: float = Field(1e-12, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip_norm: float = Field(0.0, ge=0)


class DimuonParams(_Lenient):
    type: str = "dimuon"
    learning_rate: float = Field(ge=0)
    grad_clip_norm: float = 0.0  # nonpositive: no clipping
    beta1: float = Field(0.9, ge=0, lt=1)


class OptimStepRequest(_Lenient):
    model_id: Id
    seq_id: int = Field(ge=1, le=INT64_MAX)
    adam_params: OptimizerParams | None = None  # validated as AdamParams once the seq_id is known
    optimizer_params: OptimizerParams | None = None


class SaveWeightsForSamplerRequest(_Lenient):
    model_id: Id
    seq_id: int = Field(ge=1, le=INT64_MAX)
    path: Name | None = None  # a name; absent for the ephemeral form (save_weights_and_get_sampling_client)
    sampling_session_seq_id: int | None = Field(None, ge=0, le=INT64_MAX)
    ttl_seconds: Int64 | None = None
    user_metadata: Metadata | None = None


class SaveWeightsExternalRequest(_Lenient):
    model_id: Id
    seq_id: int = Field(ge=1, le=INT64_MAX)
    path: Name
    ttl_seconds: Int64 | None = None
    # refused when not empty (app.api.checkpoints); an age recipient is ~62 characters
    age_encryption_recipients: list[Annotated[str, Field(max_length=256)]] | None = Field(None, max_length=64)


class CheckpointTtlRequest(_Lenient):
    ttl_seconds: Int64 | None = None  # None: never expires


class SaveWeightsRequest(_Lenient):
    model_id: Id
    seq_id: int = Field(ge=1, le=INT64_MAX)
    path: Name  # a checkpoint name
    overwrite: bool = False
    ttl_seconds: Int64 | None = None
    user_metadata: Metadata | None = None


class LoadWeightsRequest(_Lenient):
    """Two forms: create-via-load (session_id + model_seq_id; the load is the new model's seq 0) or a
    load into an existing model (model_id + seq_id)."""

    path: TinkerPath  # tinker://{model_id}/weights/{name}
    optimizer: bool = False
    session_id: Id | None = None
    model_seq_id: int | None = Field(None, ge=0, le=INT64_MAX)
    model_id: Id | None = None
    seq_id: int | None = Field(None, ge=1, le=INT64_MAX)
    optimizer_config: OptimizerParams | None = None
    base_model: Name | None = None
    user_metadata: Metadata | None = None


class WeightsInfoRequest(_Lenient):
    tinker_path: TinkerPath


class RetrieveFutureRequest(_Lenient):
    request_id: Id
    allow_metadata_only: bool = False


class FuturesTarget(_Lenient):
    """A sampling session's completion queue: one per clone of its client (`seq_id // 1e9`, 0 for the original)."""

    type: Literal["sampling_session"] = "sampling_session"
    sampling_session_id: Id
    cloned_sampler_id: int = Field(0, ge=0, le=INT64_MAX)


class RetrieveFuturesRequest(_Lenient):
    target: FuturesTarget
    prev_cursor: int = Field(0, ge=0, le=INT64_MAX)
    timeout: float | None = Field(None, ge=0)  # seconds to hold the poll; None: timeouts.long_poll_seconds
    retrieved_request_ids: Annotated[list[Id], Limit("max_retrieved_request_ids", "items")] = Field(
        default_factory=list
    )


class CancelFutureRequest(_Lenient):
    request_id: Id


class JoinSamplingSessionRequest(_Lenient):
    sampling_session_id: Id


class CreateSamplingSessionRequest(_Lenient):
    session_id: Id
    sampling_session_seq_id: int = Field(ge=0, le=INT64_MAX)
    base_model: Name | None = None
    model_path: TinkerPath | None = None


class SamplingParams(_Lenient):
    """Ranges are checked with the server's limits in `app.sampling.params`, naming each field."""

    max_tokens: Int64 | None = None
    seed: Seed | None = None
    stop: Stop | None = None  # None: stop at EOS; []: never stop early
    temperature: float = 1.0
    top_k: Int64 = -1
    top_p: float = 1.0


class SampleRequest(_Lenient):
    sampling_session_id: Id
    seq_id: int = Field(ge=0, le=INT64_MAX)
    num_samples: Int64 = 1
    prompt: dict[str, Any]  # ModelInput JSON: {"chunks": [...]}
    sampling_params: SamplingParams = Field(default_factory=SamplingParams)
    prompt_logprobs: bool = False
    topk_prompt_logprobs: Int64 = 0
    topk_sample_logprobs: Int64 = 0
    # not supported: refused when sent (app.sampling.params); the bound keeps its parse small
    target_prompt_logprobs: Annotated[dict[str, Any], Limit(4096, "json_bytes")] | None = None
    prompt_alt_tokens_k: Int64 = 0
    prompt_logprobs_last_n: Int64 | None = None
    record_stability_info: bool | None = None  # keep a stability record of each sequence (stable_reinforce)


class SessionProjectRequest(_Lenient):
    project_id: ProjectId | None = None


Status = Annotated[str, Field(max_length=32)]


class SessionStatusQuery(_Lenient):
    type: Status  # active | cancelled | failed | client_finished
    reasons: list[Status] | None = Field(None, max_length=8)  # client_finished: success | errored | interrupted


class SessionSearchCursor(_Lenient):
    last_created_at: str = Field(max_length=64)  # an RFC 3339 datetime
    last_session_id: Id


# what one session search asks: each display_name word, metadata pair and status is one more filter
SearchTerms = Limit("max_search_terms", "items")


class SessionSearchRequest(_Lenient):
    session_id: Id | None = None
    project_ids: list[ProjectId] | None = Field(None, max_length=MAX_PROJECT_IDS)
    user_metadata: Annotated[dict[str, str], SearchTerms, Limit("max_user_metadata_bytes", "json_bytes")] = Field(
        default_factory=dict
    )
    # as long as a stored display name (session_labels.display_name); each word is a filter
    display_name: Annotated[str, Field(max_length=400), Limit("max_search_terms", "words")] | None = None
    # one tenant: every owner's sessions are the caller's; the SDK's SearchOwner names 10 users at most
    owner: Annotated[dict[str, Any], Limit(4096, "json_bytes")] | None = None
    statuses: Annotated[list[SessionStatusQuery], SearchTerms] | None = None
    limit: int = Field(50, ge=1, le=200)
    cursor: SessionSearchCursor | None = None


class CheckpointSearchCursor(_Lenient):
    last_created_at: str = Field(max_length=64)  # an RFC 3339 datetime
    last_checkpoint_uuid: TinkerPath  # the last checkpoint's tinker path: what orders checkpoints saved at once


class SearchOwner(_Lenient):
    """The SDK's SearchOwner: `own` (the caller's checkpoints), `accessible` (theirs and every published one) or
    `user` (the published ones of the users named, as views name them in `owner`; all of the caller's own if named)."""

    type: Literal["own", "accessible", "user"] = "own"
    owner_urns: list[Id] | None = Field(None, max_length=10)


class CheckpointSearchRequest(_Lenient):
    """SDK 0.39's CheckpointSearchRequest (POST /api/v1/checkpoints/search)."""

    project_ids: list[ProjectId] | None = Field(None, max_length=MAX_PROJECT_IDS)
    user_metadata: Annotated[dict[str, str], SearchTerms, Limit("max_user_metadata_bytes", "json_bytes")] = Field(
        default_factory=dict
    )
    checkpoint_type: Literal["training", "sampler", "external"] | None = None
    owner: SearchOwner | None = None  # None: own
    base_models: Annotated[list[Name], SearchTerms] | None = None
    limit: int = Field(50, ge=1, le=INT64_MAX)  # at most limits.max_checkpoint_search_page, checked by the route
    cursor: CheckpointSearchCursor | None = None


class ExternalWeightsUploadStartRequest(_Lenient):
    """SDK 0.39+: start uploading an adapter trained elsewhere (app.api.uploads)."""

    base_model: Name
    lora_config: LoraConfig = Field(default_factory=LoraConfig)
    destination_project_id: ProjectId | None = None


class ExternalWeightsUploadFinishRequest(_Lenient):
    upload_id: Id


class CopyWeightsRequest(_Lenient):
    source_path: TinkerPath
    session_id: Id | None = None
    model_seq_id: int | None = Field(None, ge=0, le=INT64_MAX)
    destination_project_id: ProjectId | None = None
    ttl_seconds: Int64 | None = None
