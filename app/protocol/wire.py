"""JSON request bodies of the Tinker endpoints, named after `tinker.types`.

Request models ignore unknown fields and treat absent and null alike, so newer SDKs keep working.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

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


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())


class CreateSessionRequest(_Lenient):
    """`tags` and `user_metadata` are bounded together by limits.max_user_metadata_bytes (app.api.service)."""

    tags: list[str] = Field(default_factory=list)
    user_metadata: dict[str, Any] | None = None
    sdk_version: str | None = Field(None, max_length=32)
    project_id: ProjectId | None = None
    display_name: str | None = Field(None, max_length=400)


class SessionHeartbeatRequest(_Lenient):
    session_id: str


class FinishReason(_Lenient):
    type: str | None = Field(None, max_length=32)  # success | errored | interrupted


class FinishSessionRequest(_Lenient):
    reason: FinishReason | None = None
    detail: str | None = None


class LoraConfig(_Lenient):
    rank: int = Field(32, ge=1)
    seed: int | None = Field(None, ge=-(2**63), le=2**64 - 1)  # what torch.manual_seed takes
    train_unembed: bool = True
    train_mlp: bool = True
    train_attn: bool = True


class CreateModelRequest(_Lenient):
    session_id: str
    model_seq_id: int = Field(ge=0, le=INT64_MAX)
    base_model: str
    lora_config: LoraConfig = Field(default_factory=LoraConfig)
    optimizer_config: dict[str, Any] | None = None
    user_metadata: dict[str, Any] | None = None
    model_role: str | None = None  # "policy" or "critic" (SkyRL's field); or user_metadata["model_role"]


class CreateCustomLossRequest(_Lenient):
    """A traced loss; `inputs` and `graph` are checked node by node in app.training_data.custom_losses."""

    session_id: str
    custom_loss_seq_id: int = Field(ge=0, le=INT64_MAX)
    name: Name
    inputs: list[Any]
    graph: dict[str, Any]


class GetInfoRequest(_Lenient):
    model_id: str


class UnloadModelRequest(_Lenient):
    model_id: str


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
    model_id: str
    seq_id: int = Field(ge=1, le=INT64_MAX)
    adam_params: dict[str, Any] | None = None  # validated as AdamParams once the seq_id is known
    optimizer_params: dict[str, Any] | None = None


class SaveWeightsForSamplerRequest(_Lenient):
    model_id: str
    seq_id: int = Field(ge=1, le=INT64_MAX)
    path: str | None = None  # a name; absent for the ephemeral form (save_weights_and_get_sampling_client)
    sampling_session_seq_id: int | None = Field(None, ge=0, le=INT64_MAX)
    ttl_seconds: int | None = Field(None, le=INT64_MAX)
    user_metadata: dict[str, Any] | None = None


class SaveWeightsExternalRequest(_Lenient):
    model_id: str
    seq_id: int = Field(ge=1, le=INT64_MAX)
    path: str  # a name
    ttl_seconds: int | None = Field(None, le=INT64_MAX)
    age_encryption_recipients: list[str] | None = None


class CheckpointTtlRequest(_Lenient):
    ttl_seconds: int | None = Field(None, le=INT64_MAX)  # None: never expires


class SaveWeightsRequest(_Lenient):
    model_id: str
    seq_id: int = Field(ge=1, le=INT64_MAX)
    path: str  # a checkpoint name
    overwrite: bool = False
    ttl_seconds: int | None = Field(None, le=INT64_MAX)
    user_metadata: dict[str, Any] | None = None


class LoadWeightsRequest(_Lenient):
    """Two forms: create-via-load (session_id + model_seq_id; the load is the new model's seq 0) or a
    load into an existing model (model_id + seq_id)."""

    path: str  # tinker://{model_id}/weights/{name}
    optimizer: bool = False
    session_id: str | None = None
    model_seq_id: int | None = Field(None, ge=0, le=INT64_MAX)
    model_id: str | None = None
    seq_id: int | None = Field(None, ge=1, le=INT64_MAX)
    optimizer_config: dict[str, Any] | None = None
    base_model: str | None = None
    user_metadata: dict[str, Any] | None = None


class WeightsInfoRequest(_Lenient):
    tinker_path: str


class RetrieveFutureRequest(_Lenient):
    request_id: str
    allow_metadata_only: bool = False


class FuturesTarget(_Lenient):
    """A sampling session's completion queue: one per clone of its client (`seq_id // 1e9`, 0 for the original)."""

    type: Literal["sampling_session"] = "sampling_session"
    sampling_session_id: str
    cloned_sampler_id: int = Field(0, ge=0, le=INT64_MAX)


class RetrieveFuturesRequest(_Lenient):
    target: FuturesTarget
    prev_cursor: int = Field(0, ge=0, le=INT64_MAX)
    timeout: float | None = Field(None, ge=0)  # seconds to hold the poll; None: timeouts.long_poll_seconds
    retrieved_request_ids: list[str] = Field(default_factory=list)


class CancelFutureRequest(_Lenient):
    request_id: str


class JoinSamplingSessionRequest(_Lenient):
    sampling_session_id: str


class CreateSamplingSessionRequest(_Lenient):
    session_id: str
    sampling_session_seq_id: int = Field(ge=0, le=INT64_MAX)
    base_model: str | None = None
    model_path: str | None = None


class SamplingParams(_Lenient):
    """Ranges are checked with the server's limits in `app.sampling.params`, naming each field."""

    max_tokens: int | None = None
    seed: int | None = None
    stop: str | list[str] | list[int] | None = None  # None: stop at EOS; []: never stop early
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0


class SampleRequest(_Lenient):
    sampling_session_id: str
    seq_id: int = Field(ge=0, le=INT64_MAX)
    num_samples: int = 1
    prompt: dict[str, Any]  # ModelInput JSON: {"chunks": [...]}
    sampling_params: SamplingParams = Field(default_factory=SamplingParams)
    prompt_logprobs: bool = False
    topk_prompt_logprobs: int = 0
    topk_sample_logprobs: int = 0
    target_prompt_logprobs: dict[str, Any] | None = None
    prompt_alt_tokens_k: int = 0
    prompt_logprobs_last_n: int | None = None
    record_stability_info: bool | None = None  # keep a stability record of each sequence (stable_reinforce)


class SessionProjectRequest(_Lenient):
    project_id: ProjectId | None = None


class SessionStatusQuery(_Lenient):
    type: str  # active | cancelled | failed | client_finished
    reasons: list[str] | None = None  # client_finished: success | errored | interrupted


class SessionSearchCursor(_Lenient):
    last_created_at: str  # an RFC 3339 datetime
    last_session_id: str


class SessionSearchRequest(_Lenient):
    session_id: str | None = None
    project_ids: list[ProjectId] | None = Field(None, max_length=MAX_PROJECT_IDS)
    user_metadata: dict[str, str] = Field(default_factory=dict)
    display_name: str | None = None
    owner: dict[str, Any] | None = None  # one tenant: every owner's sessions are the caller's
    statuses: list[SessionStatusQuery] | None = None
    limit: int = Field(50, ge=1, le=200)
    cursor: SessionSearchCursor | None = None


class CopyWeightsRequest(_Lenient):
    source_path: str
    session_id: str | None = None
    model_seq_id: int | None = Field(None, ge=0, le=INT64_MAX)
    destination_project_id: ProjectId | None = None
    ttl_seconds: int | None = Field(None, le=INT64_MAX)
