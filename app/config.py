"""Server configuration: one root pydantic model, validated before any replica starts.

`serve_config.yaml` passes this structure as the application's `args`; environment variables are
read here and nowhere else.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.models.precision import DtypeSetting, resolve_dtype

API_KEYS_ENV = "TINKER_SERVE_API_KEYS"
DATABASE_URL_ENV = "TINKER_SERVE_DATABASE_URL"  # when database_url is not set (secrets stay out of config)
STORAGE_URI_ENV = "TINKER_SERVE_STORAGE_URI"  # when storage_uri is not set


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_custom_resources(resources: dict[str, float]) -> None:
    """Custom Ray resources (what places replicas and workers on chosen nodes); CPUs and GPUs have their own fields."""
    for name, amount in resources.items():
        if name in ("CPU", "GPU", "memory", "object_store_memory"):
            raise ValueError(f"resources may not name {name!r}: it has its own field")
        if amount < 0:
            raise ValueError(f"resources[{name!r}] must be >= 0, got {amount}")


class LimitsConfig(_Strict):
    """Every request limit; each is enforced with a user error naming the field."""

    max_datums_per_request: int = Field(1024, ge=1)
    max_tokens_per_datum: int = Field(32768, ge=2)  # and at most the base model's max_context_length
    max_request_bytes: int = Field(64 * 2**20, ge=1024)  # a forward(_backward) body, as sent and decompressed
    max_sample_request_bytes: int = Field(16 * 2**20, ge=1024)  # asample and /v1/ bodies (prompts with images)
    max_control_request_bytes: int = Field(2**20, ge=1024)  # every other route's body
    max_lora_rank: int = Field(32, ge=1)  # also the samplers' LoRA width (vLLM pads every adapter to it)
    max_models_per_base: int = Field(64, ge=1)
    fwdbwd_max_chunk_len: int = Field(1024, ge=1)  # advertised to clients in client/config
    long_poll_seconds: float = Field(20.0, gt=0, le=40)  # the SDK's poll timeout is 45 s
    command_timeout_seconds: float = Field(900.0, gt=0)  # one worker message, start-up excluded
    # a worker group's start or restart: Ray Train's wait for its resources (it would give up after 60 s) and each
    # rank's loading of the base model
    worker_start_timeout_seconds: float = Field(600.0, gt=0)
    # an operation running each time the training workers died this often (killed for memory, most likely) fails
    # with a user error instead of being resent to kill them again (app.trainer.worker_deaths)
    max_worker_deaths_per_operation: int = Field(2, ge=1)
    seq_gap_timeout_seconds: float = Field(330.0, gt=0)  # then a seq_id that never arrived is skipped
    max_num_samples: int = Field(64, ge=1)  # asample num_samples
    max_sample_tokens: int = Field(4096, ge=1)  # asample sampling_params.max_tokens
    default_sample_tokens: int = Field(256, ge=1)  # when a request leaves max_tokens out
    max_topk_logprobs: int = Field(20, ge=0)  # topk_prompt_logprobs and topk_sample_logprobs
    max_pending_samples: int = Field(512, ge=1)  # per base model and ingress replica; beyond it asample gets 429
    sample_timeout_seconds: float = Field(900.0, ge=10)  # a sample still pending this long is failed (its
    # sampler died along with the ingress that would have noticed)
    sample_retries: int = Field(3, ge=0)  # a sample whose Sampler replica died is sent again this often at most,
    sample_retry_deadline_seconds: float = Field(300.0, gt=0)  # and answered within this long of the death (a
    # replacement replica starts vLLM first: 20-60 s on CPU)
    ephemeral_sampler_ttl_seconds: float = Field(3600.0, gt=0)  # unused this long, an ephemeral sampler expires
    session_timeout_seconds: float = Field(300.0, ge=30)  # silent this long (SDKs beat every 10 s), a session
    # expires and its models are unloaded; their checkpoints stay
    min_checkpoint_ttl_seconds: int = Field(3600, ge=1)  # ttl_seconds below it are refused (the hosted minimum)
    max_checkpoint_ttl_seconds: int = Field(10 * 365 * 86400, ge=1)
    checkpoint_sweep_seconds: float = Field(60.0, gt=0)  # how often expired checkpoints' files are removed
    download_url_ttl_seconds: int = Field(3600, ge=60)  # external_weights_urls stay valid this long
    max_user_metadata_bytes: int = Field(16384, ge=2)  # a checkpoint's user_metadata, as JSON
    stability_record_ttl_seconds: float = Field(3600.0, ge=1)  # unused this long, a stability record expires
    max_stability_records_per_session: int = Field(200_000, ge=1)  # live records; asample beyond it is refused
    max_trace_events_per_session: int = Field(10_000, ge=1)  # requests kept for a session's trace export
    max_usage_window_hours: int = Field(14 * 24, ge=1)  # billing/usage/events: the widest window asked at once
    max_custom_losses_per_session: int = Field(256, ge=1)  # create_custom_loss beyond it is refused
    max_custom_loss_nodes: int = Field(512, ge=4)  # nodes of one traced custom loss graph
    max_custom_loss_elements: int = Field(2**24, ge=1024)  # elements of any tensor a custom loss computes, per datum
    # a custom loss's FLOPs over one request, estimated from the datums' lengths before any node runs (matrix products
    # as torch counts them, else elements read and written). Realistic losses (tens of element-wise nodes over [T] or
    # [T, K]) take under 10^3 FLOPs a token, ~10^10 for the largest request; 2^40 (~1.1e12) leaves 100x beyond that,
    # and refuses e.g. a [T, T] matmul per datum at T=2048 (~1.7e10 FLOPs each) past 64 datums
    max_custom_loss_flops_per_request: int = Field(2**40, ge=2**20)
    max_history_points_per_run: int = Field(20_000, ge=1)  # a run's recorded steps (app.db.history): oldest go
    # forward(_backward) loss_fn_inputs, checked from declared shapes before any datum is decoded: cells of all
    # tensors of one request, a sparse CSR one counted densified (2**25: what a dense bf16 body of max_request_bytes
    # could carry; raise the two together), and the K of an (N, K) one sent as sparse CSR (top-k inputs: K is small)
    max_loss_input_cells_per_request: int = Field(2**25, ge=1)
    max_sparse_input_width: int = Field(1024, ge=1)
    # per user (sizes: a user error naming the limit; rates: 429 with Retry-After, which the SDK waits out)
    # models not unloaded, across the user's sessions; fewer than max_models_per_base, so that no one user fills a
    # trainer
    max_live_models_per_user: int = Field(32, ge=1)
    max_checkpoint_bytes_per_user: int = Field(2**40, ge=1)  # live checkpoints; a save beyond it is refused
    max_pending_requests_per_user: int = Field(1024, ge=1)  # training operations queued or running
    max_pending_bytes_per_user: int = Field(2**30, ge=1)  # their batches' decoded bytes, held until they run
    max_long_polls_per_user: int = Field(256, ge=1)  # retrieve_future(s) waiting at once, per ingress replica
    sample_tokens_per_minute_per_user: int = Field(10_000_000, ge=1)  # num_samples x max_tokens, per ingress replica
    requests_per_minute_per_key: int = Field(60_000, ge=1)  # every call, long-polls included, per ingress replica
    failed_auth_per_minute_per_client: int = Field(600, ge=1)  # refused keys per client address and ingress replica
    # a finished future's row and result are removed this long after it finished (SDKs fetch results in seconds);
    # futures a model's journal still replays stay
    future_retention_seconds: float = Field(7 * 86400.0, ge=60)
    audit_retention_days: float = Field(90.0, gt=0)  # audit events older than this are removed
    # another user's published checkpoint read by one user for one purpose is audited once this often, per replica
    audit_read_dedupe_seconds: float = Field(3600.0, ge=0)
    max_sample_temperature: float = Field(2.0, gt=0)  # asample's and /v1/ routes' temperature above it is refused

    @model_validator(mode="after")
    def _check(self) -> LimitsConfig:
        if self.max_live_models_per_user >= self.max_models_per_base:
            raise ValueError(
                f"max_live_models_per_user {self.max_live_models_per_user} must be below max_models_per_base "
                f"{self.max_models_per_base}: else one user can fill every model slot of a trainer"
            )
        return self


class SamplerConfig(_Strict):
    """The vLLM Sampler deployment of one base model: engine sizing and Serve autoscaling."""

    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(1, ge=1)
    target_ongoing_requests: float = Field(16, gt=0)  # per replica, what autoscaling aims for
    max_ongoing_requests: int = Field(64, ge=1)  # per replica; more wait in Serve's queue
    num_cpus: float = Field(1.0, ge=0)
    num_gpus: float = Field(0.0, ge=0)
    max_loras: int = Field(4, ge=1)  # adapters in one batch
    max_cpu_loras: int = Field(8, ge=2)  # adapters kept loaded per replica (LRU beyond it)
    max_num_seqs: int = Field(64, ge=1)
    kv_cache_mib: int = Field(256, ge=16)  # CPU KV cache (GPU: gpu_memory_utilization)
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1)
    tensor_parallel_size: int = Field(1, ge=1)
    dtype: str = "auto"  # what vLLM takes; auto: the trainer's dtype (BaseModelConfig.sampler_dtype), so that
    # sampler and trainer logprobs agree
    enforce_eager: bool = True  # CPU: compiling costs ~40 s of start-up for ~4%; GPU: set false for CUDA graphs
    env: dict[str, str] = Field(default_factory=dict)  # e.g. VLLM_CPU_OMP_THREADS_BIND
    resources: dict[str, float] = Field(default_factory=dict)  # custom Ray resources per replica (node placement)

    @model_validator(mode="after")
    def _check(self) -> SamplerConfig:
        _check_custom_resources(self.resources)
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas {self.min_replicas} exceeds max_replicas {self.max_replicas}")
        return self


ROLES = ("policy", "critic")  # a policy scores tokens with the LM head; a critic predicts values with a value head


class WorkerGroupConfig(_Strict):
    """The shape of one trainer's Ray Train worker group (data parallel: datums split across workers; the frozen base
    replicated or sharded across them), how its ranks hold the base, and how its Trainer feeds it (fair share across
    users: app.trainer.fair_share)."""

    num_workers: int = Field(2, ge=1)
    cpus_per_worker: float = Field(1.0, gt=0)
    use_gpu: bool = False
    torch_threads_per_worker: int = Field(1, ge=1)
    resources: dict[str, float] = Field(default_factory=dict)  # custom Ray resources per worker (node placement)
    # the base model's weights: auto is bfloat16 on GPUs and on CPUs with bfloat16 matrix instructions (AMX,
    # AVX512-BF16), else float32 (app.models.precision); adapters, value heads and optimizer state stay float32
    dtype: DtypeSetting = "auto"
    # fsdp: each rank holds 1/num_workers of the base (FSDP2), gathering one layer's weights at a time; replicate:
    # every rank holds all of it (no gathers: a little faster when it fits)
    sharding: Literal["replicate", "fsdp"] = "fsdp"
    shard_group_size: int | None = Field(None, ge=1)  # fsdp within groups of this many ranks, replicated across
    # groups (hybrid sharding, e.g. the GPUs of one node); None: one group of all ranks
    # keep only each decoder layer's input for the backward and recompute the rest (about 1/3 more compute for a
    # fraction of the activation memory: what long contexts need)
    activation_checkpointing: bool = True
    # a rank runs its datums in forward/backward passes of at most this many (padded) tokens, accumulating
    # gradients: a request's activation memory is one pass's, however many datums it has
    micro_batch_tokens: int = Field(16384, ge=1)
    # with a bfloat16 base: forward passes under bf16 autocast, the LoRA matmuls included (adapter weights, gradients
    # and optimizer state stay float32); faster, and the adapters' products are rounded to bf16 (README, "Precision")
    autocast: bool = False
    # runs of operations sent to the workers and not yet answered: 2 hides the command round trip; the rest wait in
    # the Trainer, where the next run is chosen fairly across users (large: every run is sent as it becomes ready)
    max_dispatched_runs: int = Field(2, ge=1)
    # an operation's cost in the fair share is its tokens for a forward / forward_backward, this for any other; each
    # grant of credit carries this much extra, so an optim_step leaves with the forward_backward before it
    fixed_op_cost_tokens: int = Field(64, ge=0)
    # each live model's adapter + optimizer state is snapshotted unasked after an optim_step (or load) once this
    # many have run since its last snapshot, or this many seconds have passed; a dead worker's models are rebuilt
    # from their snapshot and the journal of operations since (app.db.journal)
    snapshot_every_steps: int = Field(10, ge=1)
    snapshot_every_seconds: float = Field(300.0, gt=0)

    @model_validator(mode="after")
    def _check(self) -> WorkerGroupConfig:
        _check_custom_resources(self.resources)
        if self.shard_group_size is not None and self.num_workers % self.shard_group_size:
            raise ValueError(f"shard_group_size {self.shard_group_size} must divide num_workers {self.num_workers}")
        return self


class BaseModelConfig(_Strict):
    """A base model served for LoRA training and sampling, with its trainers' worker groups."""

    name: str  # what clients pass as base_model
    path: str  # local directory or Hugging Face id
    # build into `path` if missing (app.models.embedded.PRESETS)
    embedded_preset: (
        Literal["tiny", "small", "qwen3-0.6b", "tiny-qwen3", "tiny-llama", "tiny-qwen3-moe", "tiny-gpt-oss"] | None
    ) = None
    trainer: WorkerGroupConfig = WorkerGroupConfig()  # policies, and critics unless critic_trainer is set
    critic_trainer: WorkerGroupConfig | None = None  # critics on a worker group of their own
    # training and sampling; at most the model's max_position_embeddings, and on CPU what sampler.kv_cache_mib holds
    max_context_length: int = Field(32768, ge=2)
    sampler: SamplerConfig = SamplerConfig()

    def sampler_dtype(self) -> str:
        """The dtype the Sampler's vLLM runs in: sampler.dtype, or with auto the trainer's, as its workers resolve it
        (app.models.precision, read on the Sampler's machine: give nodes of one kind both)."""
        if self.sampler.dtype != "auto":
            return self.sampler.dtype
        return resolve_dtype(self.trainer.dtype, self.trainer.use_gpu)

    def trainer_for(self, role: str) -> str:
        """The name of the trainer (one Trainer deployment and worker group) that holds models of `role`."""
        return f"{self.name}:critic" if role == "critic" and self.critic_trainer is not None else self.name

    def trainer_groups(self) -> dict[str, WorkerGroupConfig]:
        """Every trainer of this base model by name, with its worker group shape."""
        groups = {self.name: self.trainer}
        if self.critic_trainer is not None:
            groups[self.trainer_for("critic")] = self.critic_trainer
        return groups


class AuthConfig(_Strict):
    """`any_tml_key_on_loopback`: any `tml-` key from 127.0.0.0/8 or ::1 (the laptop default), each its own user.
    `api_keys`: keys issued by `tinker-serve keys create`, and keys from the environment variable and/or a secret
    file (one key per line), each its own user."""

    mode: Literal["any_tml_key_on_loopback", "api_keys"] = "api_keys"
    api_keys_file: str | None = None
    # how long a replica trusts what it read of a key; a revoked key stops working on every replica within this
    key_cache_seconds: float = Field(2.0, ge=0)
    admin_users: list[str] = Field(default_factory=list)  # users (tinker-serve keys create --user) who read all audit
    # client/config tells SDKs to exchange their key for short-lived JWTs (POST /auth/token) and send those instead
    jwt_enabled: bool = False
    jwt_ttl_seconds: int = Field(900, ge=60)

    def load_keys(self) -> frozenset[str]:
        keys = {k.strip() for k in os.environ.get(API_KEYS_ENV, "").split(",") if k.strip()}
        if self.api_keys_file:
            lines = Path(self.api_keys_file).read_text().splitlines()
            keys |= {line.strip() for line in lines if line.strip() and not line.startswith("#")}
        return frozenset(keys)


class FeaturesConfig(_Strict):
    """Optional protocol features told to clients in client/config."""

    # SamplingClients wait for their samples through one retrieve_futures long-poll per sampling session
    # instead of one retrieve_future long-poll per sample
    sample_use_retrieve_futures: bool = True


class ServerConfig(_Strict):
    state_dir: str = "state"
    # Futures and metadata: else $TINKER_SERVE_DATABASE_URL, else a SQLite file under state_dir;
    # postgresql+asyncpg://... on clusters (keep its password in the environment, not here)
    database_url: str | None = None
    # Checkpoints: else $TINKER_SERVE_STORAGE_URI, else {state_dir}/checkpoints; any pyarrow.fs URI on clusters,
    # e.g. s3://bucket/prefix?region=us-east-1 (credentials from AWS_* environment variables, never here)
    storage_uri: str | None = None
    base_models: list[BaseModelConfig]
    limits: LimitsConfig = LimitsConfig()
    auth: AuthConfig = AuthConfig()
    features: FeaturesConfig = FeaturesConfig()
    ingress_replicas: int = Field(1, ge=1)

    @model_validator(mode="after")
    def _check(self) -> ServerConfig:
        names = [m.name for m in self.base_models]
        if not names:
            raise ValueError("base_models must list at least one model")
        if len(set(names)) != len(names):
            raise ValueError(f"base_models names must be unique, got {names}")
        if self.limits.min_checkpoint_ttl_seconds > self.limits.max_checkpoint_ttl_seconds:
            raise ValueError("limits.min_checkpoint_ttl_seconds exceeds limits.max_checkpoint_ttl_seconds")
        if self.auth.mode == "api_keys" and not self.auth.load_keys():
            raise ValueError(
                f"auth.mode is api_keys but no keys are configured: set {API_KEYS_ENV} or auth.api_keys_file"
            )
        return self

    def resolved(self) -> ServerConfig:
        """A copy with every local path made absolute (Ray Train workers change directory)."""
        state = str(Path(self.state_dir).resolve())
        models = [
            m.model_copy(update={"path": str(Path(m.path).resolve()) if m.embedded_preset else _abs_if_local(m.path)})
            for m in self.base_models
        ]
        storage = self.storage_uri
        if storage and "://" not in storage:
            storage = str(Path(storage).resolve())
        return self.model_copy(update={"state_dir": state, "base_models": models, "storage_uri": storage})

    @property
    def db_url(self) -> str:
        """Read in each process (the environment holds secrets that must not travel in deployment args)."""
        return (
            self.database_url
            or os.environ.get(DATABASE_URL_ENV)
            or f"sqlite+aiosqlite:///{Path(self.state_dir).resolve() / 'tinker_serve.db'}"
        )

    @property
    def checkpoint_uri(self) -> str:
        """Where checkpoints are stored (like db_url, read in each process)."""
        return (
            self.storage_uri or os.environ.get(STORAGE_URI_ENV) or str(Path(self.state_dir).resolve() / "checkpoints")
        )

    def base_model(self, name: str) -> BaseModelConfig | None:
        return next((m for m in self.base_models if m.name == name), None)

    def configured_base_model(self, name: str) -> BaseModelConfig:
        """The base model called `name`, a name taken from this same configuration (deployments get theirs so)."""
        base = self.base_model(name)
        if base is None:
            raise ValueError(f"base model {name!r} is not in the configuration")
        return base


_SECRET_QUERY_KEYS = ("key", "secret", "token", "password", "credential")


def redacted(url: str) -> str:
    """`url` fit for logs: a password in it, and query values whose names look secret, become `***`."""
    password = urlsplit(url).password
    if password:
        url = url.replace(f":{password}@", ":***@", 1)
    base, question, query = url.partition("?")
    if not question:
        return url
    items = [(item.partition("=")[0], item) for item in query.split("&")]
    shown = [f"{key}=***" if any(word in key.lower() for word in _SECRET_QUERY_KEYS) else item for key, item in items]
    return f"{base}?{'&'.join(shown)}"


def _abs_if_local(path: str) -> str:
    """Relative paths that exist or look local become absolute; `org/name` hub ids stay as they are."""
    p = Path(path)
    if p.is_absolute() or p.exists() or path.startswith("."):
        return str(p.resolve())
    return path
