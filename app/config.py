"""Server configuration: one root pydantic model, validated before any replica starts.

`serve_config.yaml` passes this structure as the application's `args`; environment variables are
read here and nowhere else. Validation reads no file: the API keys are read (`AuthConfig.load_keys`) by the code
that checks them, the ingress, and by the build step that fails fast without them. The server-wide sections
(limits, timeouts, retention, quotas, engine) are in app.config_sections.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import Field, model_validator

from app.config_sections import (
    MOVED_FROM_LIMITS,
    SECTIONS,
    EngineConfig,
    ImagesConfig,
    LimitsConfig,
    MetricsConfig,
    QuotasConfig,
    RetentionConfig,
    Strict,
    TimeoutsConfig,
    UploadsConfig,
)
from app.models.embedded import PresetName
from app.models.precision import DtypeSetting, resolve_dtype

__all__ = [
    "API_KEYS_ENV",
    "DATABASE_URL_ENV",
    "MOVED_FROM_LIMITS",
    "ROLES",
    "SECTIONS",
    "STORAGE_URI_ENV",
    "AuthConfig",
    "BaseModelConfig",
    "EngineConfig",
    "FeaturesConfig",
    "ImagesConfig",
    "LimitsConfig",
    "MetricsConfig",
    "QuotasConfig",
    "RetentionConfig",
    "SamplerConfig",
    "ServerConfig",
    "TimeoutsConfig",
    "UploadsConfig",
    "WorkerGroupConfig",
    "redacted",
]

API_KEYS_ENV = "TINKER_SERVE_API_KEYS"
DATABASE_URL_ENV = "TINKER_SERVE_DATABASE_URL"  # when database_url is not set (secrets stay out of config)
STORAGE_URI_ENV = "TINKER_SERVE_STORAGE_URI"  # when storage_uri is not set


def _check_custom_resources(resources: dict[str, float]) -> None:
    """Custom Ray resources (what places replicas and workers on chosen nodes); CPUs and GPUs have their own fields."""
    for name, amount in resources.items():
        if name in ("CPU", "GPU", "memory", "object_store_memory"):
            raise ValueError(f"resources may not name {name!r}: it has its own field")
        if amount < 0:
            raise ValueError(f"resources[{name!r}] must be >= 0, got {amount}")


class SamplerConfig(Strict):
    """The vLLM Sampler deployment of one base model: engine sizing and Serve autoscaling."""

    min_replicas: int = Field(1, ge=0, description="Serve autoscaling's fewest replicas")
    max_replicas: int = Field(1, ge=1, description="Serve autoscaling's most replicas")
    target_ongoing_requests: float = Field(16, gt=0, description="per replica, what autoscaling aims for")
    max_ongoing_requests: int = Field(64, ge=1, description="per replica; more wait in Serve's queue")
    num_cpus: float = Field(1.0, ge=0, description="CPUs per replica")
    num_gpus: float = Field(
        0.0,
        ge=0,
        description="GPUs per replica (= tensor_parallel_size on GPUs); 0: on CPU; below 1: the replica shares a GPU "
        "(e.g. with a trainer rank on a one-GPU machine, deploy/serve_config.one-gpu.yaml): then "
        "gpu_memory_utilization must leave the others their memory",
    )
    max_loras: int = Field(4, ge=1, description="adapters in one batch")
    max_cpu_loras: int = Field(8, ge=2, description="adapters kept loaded per replica (LRU beyond it)")
    max_num_seqs: int = Field(64, ge=1, description="sequences vLLM runs in one batch")
    kv_cache_mib: Annotated[int, Field(ge=16)] | Literal["auto"] = Field(
        "auto",
        description="CPU KV cache in MiB (GPU: gpu_memory_utilization); on CPU it caps the context at the tokens of "
        "its whole 128-token blocks less one (vLLM's own accounting: the 0.6B shape's 2,048 MiB holds 18,560). auto: "
        "one whole context of the base model, at least 256, at most 1/8 of the machine's memory "
        "(app.sampling.kv_budget)",
    )
    gpu_memory_utilization: float = Field(
        0.5,
        gt=0,
        le=1,
        description="the share of its GPU's whole memory vLLM takes (weights, activations, KV cache), at start; on a "
        "shared GPU it must be free then (vLLM refuses to start otherwise)",
    )
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs one vLLM engine spans")
    dtype: str = Field(
        "auto",
        description="what vLLM takes; auto: the trainer's dtype (BaseModelConfig.sampler_dtype), so that sampler and "
        "trainer logprobs agree",
    )
    enforce_eager: bool = Field(
        True, description="CPU: compiling costs ~40 s of start-up for ~4%; GPU: set false for CUDA graphs"
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="environment variables of each replica, e.g. VLLM_CPU_OMP_THREADS_BIND"
    )
    resources: dict[str, float] = Field(
        default_factory=dict, description="custom Ray resources per replica (node placement)"
    )

    def kv_cache_bytes(self) -> int:
        """The CPU KV cache's bytes, once `auto` was chosen for the base model (deployments.builder)."""
        if self.kv_cache_mib == "auto":
            raise ValueError("sampler.kv_cache_mib auto is chosen for the base model when the app is built")
        return self.kv_cache_mib * 2**20

    @model_validator(mode="after")
    def _check(self) -> SamplerConfig:
        _check_custom_resources(self.resources)
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas {self.min_replicas} exceeds max_replicas {self.max_replicas}")
        if self.shares_a_gpu() and self.tensor_parallel_size > 1:
            raise ValueError(
                f"num_gpus {self.num_gpus} is a share of one GPU, but tensor_parallel_size "
                f"{self.tensor_parallel_size} spans GPUs: give each replica tensor_parallel_size whole GPUs"
            )
        return self

    def shares_a_gpu(self) -> bool:
        """Whether each replica reserves a fraction of one GPU (0 < num_gpus < 1) in Ray."""
        return 0 < self.num_gpus < 1


ROLES = ("policy", "critic")  # a policy scores tokens with the LM head; a critic predicts values with a value head


class WorkerGroupConfig(Strict):
    """The shape of one trainer's Ray Train worker group (data parallel: datums split across workers; the frozen base
    replicated or sharded across them), how its ranks hold the base, and how its Trainer feeds it (fair share across
    users: app.trainer.fair_share)."""

    num_workers: int = Field(2, ge=1, description="ranks of the group; datums are split across them")
    cpus_per_worker: float = Field(1.0, gt=0, description="CPUs per rank")
    use_gpu: bool = Field(False, description="each rank on a GPU (gpus_per_worker of one; NCCL between ranks)")
    gpus_per_worker: float = Field(
        1.0,
        gt=0,
        le=1,
        description="with use_gpu: the share of a GPU each rank reserves in Ray. Below 1 the rank shares its GPU "
        "(a one-GPU machine: with the Sampler, deploy/serve_config.one-gpu.yaml), which a group of one rank only may "
        "do: NCCL refuses two ranks on one device, and Ray may place two fractional ranks on the same one",
    )
    gpu_memory_fraction: float | None = Field(
        None,
        gt=0,
        le=1,
        description="with use_gpu: the share of its GPU's memory a rank's torch may hold "
        "(torch.cuda.set_per_process_memory_fraction; past it an allocation fails with CUDA out of memory); on a GPU "
        "shared with the Sampler, what leaves vLLM its gpu_memory_utilization, even across a Sampler restart. "
        "None: no cap",
    )
    torch_threads_per_worker: int = Field(1, ge=1, description="torch's intra-op threads per rank")
    resources: dict[str, float] = Field(
        default_factory=dict, description="custom Ray resources per worker (node placement)"
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="environment variables of each rank (Ray Train's worker_runtime_env); CPU ranks preload tcmalloc "
        'where it is installed (app.allocator): set LD_PRELOAD to "" to go without',
    )
    dtype: DtypeSetting = Field(
        "auto",
        description="the base model's weights: auto is bfloat16 on GPUs and on CPUs with bfloat16 matrix instructions "
        "(AMX, AVX512-BF16), else float32 (app.models.precision); adapters, value heads and optimizer state stay "
        "float32",
    )
    sharding: Literal["replicate", "fsdp", "auto"] = Field(
        "auto",
        description="fsdp: each rank holds 1/num_workers of the base (FSDP2), gathering one layer's weights at a "
        "time; replicate: every rank holds all of it (no gathers: a little faster when it fits); auto: replicate when "
        "the base's weight files total at most 512 MiB, else fsdp (app.trainer.model_defaults; logged at start)",
    )
    shard_group_size: int | None = Field(
        None,
        ge=1,
        description="fsdp within groups of this many ranks, replicated across groups (hybrid sharding, e.g. the GPUs "
        "of one node); None: one group of all ranks",
    )
    activation_checkpointing: bool | Literal["auto"] = Field(
        "auto",
        description="keep only each decoder layer's input for the backward and recompute the rest (about 1/3 more "
        "compute for a fraction of the activation memory: what long contexts need); auto: off when a pass of "
        "micro_batch_tokens needs at most 2 GiB of activations without it (docs/sizing.md's estimate), else on",
    )
    micro_batch_tokens: int = Field(
        16384,
        ge=1,
        description="a rank runs its datums in forward/backward passes of at most this many (padded) tokens, "
        "accumulating gradients: a request's activation memory is one pass's, however many datums it has",
    )
    sequence_parallel: int | None = Field(
        None,
        ge=1,
        description="ranks that run one long datum together, each a consecutive slice of its tokens (Ulysses: "
        "attention and linear attention exchange heads across them): a rank then holds 1/N of the datum's "
        "activations; None: every rank of the group; 1: a datum always runs whole on one rank. Must divide "
        "num_workers; the model's attention heads must divide by it (else datums run whole, with a warning)",
    )
    sequence_parallel_min_tokens: int = Field(
        4096,
        ge=1,
        description="a datum of more tokens than this is split across its sequence-parallel group; shorter datums "
        "go whole to one rank each (data parallel)",
    )
    memory_per_worker_mib: int | None = Field(
        None,
        ge=1,
        description="the memory one rank has, in MiB (a CPU rank: its share of its node's RAM; a GPU rank: its GPU's "
        "memory): a forward(_backward) whose largest pass on a rank needs more activations than this, by the "
        "estimate of app.trainer.memory_estimate (docs/sizing.md), is refused before any pass with what to change. "
        "Weights, optimizer state and slack come on top, so what passes may still not fit (an operation that kills "
        "the workers fails after timeouts.max_worker_deaths_per_operation deaths). None: unknown, nothing is refused "
        "for memory. Not reserved in Ray",
    )
    autocast: bool = Field(
        False,
        description="with a bfloat16 base: forward passes under bf16 autocast, the LoRA matmuls included (adapter "
        "weights, gradients and optimizer state stay float32); faster, and the adapters' products are rounded to "
        "bf16 (docs/guides/large-models.md)",
    )
    max_dispatched_runs: int = Field(
        2,
        ge=1,
        description="runs of operations sent to the workers and not yet answered: 2 hides the command round trip; "
        "the rest wait in the Trainer, where the next run is chosen fairly across users (large: every run is sent as "
        "it becomes ready)",
    )
    mixed_pass_models: int = Field(
        8,
        ge=1,
        description="ready forward/forward_backwards of up to this many models (any users) run as one pass over "
        "the base, each row through its own model's adapter, when together they fit one micro-batch on every rank "
        "(micro_batch_tokens) and the base is not a mixture of experts; each is charged its own tokens in the fair "
        "share, as if it ran alone (1: one model at a time)",
    )
    fixed_op_cost_tokens: int = Field(
        64,
        ge=0,
        description="an operation's cost in the fair share is its tokens for a forward / forward_backward, this for "
        "any other; each grant of credit carries this much extra, so an optim_step leaves with the forward_backward "
        "before it",
    )
    snapshot_every_steps: int = Field(
        10,
        ge=1,
        description="each live model's adapter + optimizer state is snapshotted unasked after an optim_step (or "
        "load) once this many have run since its last snapshot (or snapshot_every_seconds passed); a dead worker's "
        "models are rebuilt from their snapshot and the journal of operations since (app.db.journal)",
    )
    snapshot_every_seconds: float = Field(
        300.0, gt=0, description="or once this many seconds have passed since its last snapshot"
    )

    @model_validator(mode="after")
    def _check(self) -> WorkerGroupConfig:
        _check_custom_resources(self.resources)
        if not self.use_gpu and (self.gpus_per_worker != 1 or self.gpu_memory_fraction is not None):
            raise ValueError("gpus_per_worker and gpu_memory_fraction are for GPU ranks: set use_gpu: true")
        if self.shares_a_gpu() and self.num_workers > 1:
            raise ValueError(
                f"gpus_per_worker {self.gpus_per_worker} shares a GPU, which a group of one rank only may do "
                f"(num_workers is {self.num_workers}): NCCL refuses two ranks on one device, and Ray may place two "
                "fractional ranks on the same one. Use num_workers: 1, or whole GPUs"
            )
        if self.shard_group_size is not None and self.num_workers % self.shard_group_size:
            raise ValueError(f"shard_group_size {self.shard_group_size} must divide num_workers {self.num_workers}")
        if self.sequence_parallel is not None and self.num_workers % self.sequence_parallel:
            raise ValueError(f"sequence_parallel {self.sequence_parallel} must divide num_workers {self.num_workers}")
        return self

    def shares_a_gpu(self) -> bool:
        """Whether each rank reserves a fraction of one GPU in Ray (use_gpu with gpus_per_worker below 1)."""
        return self.use_gpu and self.gpus_per_worker < 1

    def shards_base(self) -> bool:
        """Whether the base is sharded across the ranks (auto, unresolved, as a real model: yes)."""
        return self.sharding != "replicate" and self.num_workers > 1

    def recomputes_activations(self) -> bool:
        """Whether activations are recomputed in the backward (auto, unresolved, as a real model: yes)."""
        return self.activation_checkpointing is not False


class BaseModelConfig(Strict):
    """A base model served for LoRA training and sampling, with its trainers' worker groups."""

    name: str = Field(description="what clients pass as base_model")
    path: str = Field(description="local directory or Hugging Face id")
    embedded_preset: PresetName | None = Field(
        None,
        description="build into `path` if missing (app.models.embedded.PRESETS), when path's folder is named after "
        "the preset (models/tiny); with any other path (a real model swapped in) the line is ignored, with a warning",
    )
    trainer: WorkerGroupConfig = Field(
        WorkerGroupConfig(), description="policies, and critics unless critic_trainer is set"
    )
    critic_trainer: WorkerGroupConfig | None = Field(None, description="critics on a worker group of their own")
    max_context_length: int | None = Field(
        None,
        ge=2,
        description="tokens of a datum (training) and of a prompt with its samples (sampling, vLLM's max_model_len). "
        "None: the model's context, its config.json's max_position_embeddings (a multimodal model's text_config's), or "
        "what a yarn, dynamic or linear RoPE scaling there gives (factor x original_max_position_embeddings); a number "
        "caps it. On CPU also at most what sampler.kv_cache_mib holds; on GPU the sampler's KV cache "
        "(gpu_memory_utilization) must hold one whole context or vLLM refuses to start: set a cap then",
    )
    sampler: SamplerConfig = Field(SamplerConfig(), description="the vLLM Sampler deployment of this base model")

    def builds_embedded(self) -> bool:
        """Whether `embedded_preset` is built into `path`: only into a folder named after it (models/tiny). A real
        model's path swapped in with the embedded config's preset line left there serves that model, never random
        weights under its name (the builder says so)."""
        return self.embedded_preset is not None and Path(self.path).name == self.embedded_preset

    @model_validator(mode="after")
    def _check_shared_gpu(self) -> BaseModelConfig:
        """Trainer ranks and Sampler replicas that take shares of one GPU may land on the same device (on a one-GPU
        machine they do): their memory shares must fit in it together."""
        if not self.sampler.shares_a_gpu():
            return self
        for name, group in self.trainer_groups().items():
            cap = group.gpu_memory_fraction
            if group.shares_a_gpu() and cap is not None and cap + self.sampler.gpu_memory_utilization > 1:
                raise ValueError(
                    f"trainer {name}'s ranks and the sampler's replicas share a GPU (gpus_per_worker "
                    f"{group.gpus_per_worker}, num_gpus {self.sampler.num_gpus}), but their memory does not fit in "
                    f"one: gpu_memory_fraction {cap} + sampler.gpu_memory_utilization "
                    f"{self.sampler.gpu_memory_utilization} > 1"
                )
        return self

    def shares_a_gpu(self) -> bool:
        """Whether the policy trainer's ranks and the Sampler's replicas both take shares of a GPU, with no custom
        resources that put them on nodes of their own: on a one-GPU machine they share its device."""
        trainer, sampler = self.trainer, self.sampler
        return trainer.shares_a_gpu() and sampler.shares_a_gpu() and not (trainer.resources or sampler.resources)

    def sampler_dtype(self) -> str:
        """The dtype the Sampler's vLLM runs in: sampler.dtype, or with auto the trainer's, as its workers resolve it
        (app.models.precision, read on the Sampler's machine: give nodes of one kind both)."""
        if self.sampler.dtype != "auto":
            return self.sampler.dtype
        return resolve_dtype(self.trainer.dtype, self.trainer.use_gpu)

    def sampler_starts_after_trainer(self, cores: int) -> bool:
        """Whether the Sampler starts vLLM only once the policy trainer is up: when both run on CPU with no node of
        their own (custom resources) and the machine's `cores` are fewer than the trainer's ranks' threads and two
        more (vLLM's engine and its replica), they contend for its cores, and starting both at once slows the trainer,
        which the first create_model waits for (2 cores, tiny: the first model 55 s after launch, not 69;
        bench/results/history.md). With cores to spare both start at once. And when they share a GPU
        (shares_a_gpu): vLLM sizes its KV cache by profiling the device's free memory, assuming the other processes on
        it hold theirs steady meanwhile (0.32: vllm/v1/worker/gpu_worker.py), which a trainer loading its base does
        not."""
        if self.shares_a_gpu():
            return True
        trainer, sampler = self.trainer, self.sampler
        if trainer.use_gpu or sampler.num_gpus or trainer.resources or sampler.resources:
            return False
        return cores < trainer.num_workers * trainer.torch_threads_per_worker + 2

    def trainer_for(self, role: str) -> str:
        """The name of the trainer (one Trainer deployment and worker group) that holds models of `role`."""
        return f"{self.name}:critic" if role == "critic" and self.critic_trainer is not None else self.name

    def trainer_groups(self) -> dict[str, WorkerGroupConfig]:
        """Every trainer of this base model by name, with its worker group shape."""
        groups = {self.name: self.trainer}
        if self.critic_trainer is not None:
            groups[self.trainer_for("critic")] = self.critic_trainer
        return groups


class AuthConfig(Strict):
    """`any_tml_key_on_loopback`: any `tml-` key from 127.0.0.0/8 or ::1 (the laptop default), each its own user.
    `api_keys`: keys issued by `tinker-serve keys create`, and keys from the environment variable and/or a secret
    file (one key per line), each its own user."""

    mode: Literal["any_tml_key_on_loopback", "api_keys"] = Field(
        "api_keys", description="who may call: any tml- key on loopback (the laptop default), or API keys"
    )
    api_keys_file: str | None = Field(
        None,
        description="a secret file of keys, one per line (# comments); read by the ingress (and the build step), "
        f"never in validation; keys also come from ${API_KEYS_ENV}, comma-separated",
    )
    key_cache_seconds: float = Field(
        2.0,
        ge=0,
        description="how long a replica trusts what it read of a key; a revoked key stops working on every replica "
        "within this",
    )
    admin_users: list[str] = Field(
        default_factory=list, description="users (tinker-serve keys create --user) who read all audit events"
    )
    jwt_enabled: bool = Field(
        False,
        description="client/config tells SDKs to exchange their key for short-lived JWTs (POST /auth/token) and send "
        "those instead",
    )
    jwt_ttl_seconds: int = Field(900, ge=60, description="how long such a JWT is valid")
    trusted_proxies: list[str] = Field(
        default_factory=list,
        description="addresses or CIDRs of the reverse proxies in front of the server (e.g. [10.0.0.5, 10.1.0.0/16]): "
        "from these the client is the right-most X-Forwarded-For address not among them; any other peer's "
        "X-Forwarded-For is ignored. Empty: the peer's address is the client's",
    )

    @model_validator(mode="after")
    def _check_trusted_proxies(self) -> AuthConfig:
        for proxy in self.trusted_proxies:
            try:
                ipaddress.ip_network(proxy, strict=False)
            except ValueError:
                raise ValueError(f"auth.trusted_proxies: {proxy!r} is not an IP address or CIDR") from None
        return self

    def load_keys(self) -> frozenset[str]:
        """The configured keys: ${API_KEYS_ENV}'s and api_keys_file's, read now (I/O: never called while validating).
        In api_keys mode no key at all is an error, raised where the keys are loaded: `serve run`'s build step and
        each ingress replica's start."""
        keys = {k.strip() for k in os.environ.get(API_KEYS_ENV, "").split(",") if k.strip()}
        if self.api_keys_file:
            lines = Path(self.api_keys_file).read_text().splitlines()
            keys |= {line.strip() for line in lines if line.strip() and not line.startswith("#")}
        if self.mode == "api_keys" and not keys:
            raise ValueError(
                f"auth.mode is api_keys but no keys are configured: set {API_KEYS_ENV} or auth.api_keys_file"
            )
        return frozenset(keys)


class FeaturesConfig(Strict):
    """Optional protocol features told to clients in client/config."""

    sample_use_retrieve_futures: bool = Field(
        True,
        description="SamplingClients wait for their samples through one retrieve_futures long-poll per sampling "
        "session instead of one retrieve_future long-poll per sample",
    )


class ServerConfig(Strict):
    """The application's `args`: where state lives, the base models, the server-wide sections, auth."""

    state_dir: str = Field(
        "state", description="node-local scratch (Ray Train run folders, sampler caches) and the default database"
    )
    database_url: str | None = Field(
        None,
        description=f"futures and metadata: else ${DATABASE_URL_ENV}, else a SQLite file under state_dir; "
        "postgresql+asyncpg://... on clusters (keep its password in the environment, not here)",
    )
    storage_uri: str | None = Field(
        None,
        description=f"checkpoints: else ${STORAGE_URI_ENV}, else {{state_dir}}/checkpoints; any pyarrow.fs URI on "
        "clusters, e.g. s3://bucket/prefix?region=us-east-1 (credentials from AWS_* environment variables, never "
        "here)",
    )
    base_models: list[BaseModelConfig] = Field(description="the base models served, each with its trainers and sampler")
    limits: LimitsConfig = Field(LimitsConfig(), description="per-request size and shape limits")
    timeouts: TimeoutsConfig = Field(TimeoutsConfig(), description="how long the server waits, and its retries")
    retention: RetentionConfig = Field(
        RetentionConfig(), description="how long stored things are kept, and how often sweeps remove them"
    )
    quotas: QuotasConfig = Field(
        QuotasConfig(), description="per user, key, client, session and base model: what may be held or sent at once"
    )
    engine: EngineConfig = Field(EngineConfig(), description="the LoRA width and model slots of every base model")
    auth: AuthConfig = Field(AuthConfig(), description="who may call the API")
    features: FeaturesConfig = Field(FeaturesConfig(), description="optional protocol features told to clients")
    metrics: MetricsConfig = Field(
        MetricsConfig(), description="the metrics' per-user and per-model labels: off by default, capped when on"
    )
    uploads: UploadsConfig = Field(UploadsConfig(), description="uploading LoRA adapters trained elsewhere")
    images: ImagesConfig = Field(ImagesConfig(), description="where image_asset_pointer chunks may point")
    ingress_replicas: int = Field(1, ge=1, description="replicas of the Ingress deployment (the HTTP API)")

    @model_validator(mode="after")
    def _check(self) -> ServerConfig:
        names = [m.name for m in self.base_models]
        if not names:
            raise ValueError("base_models must list at least one model")
        if len(set(names)) != len(names):
            raise ValueError(f"base_models names must be unique, got {names}")
        slots = self.engine.max_models_per_base
        users = [("", self.quotas), *((f" of {user}", self.quotas.for_user(user)) for user in self.quotas.users)]
        for where, quotas in users:
            if (live := quotas.max_live_models_per_user) >= slots:
                raise ValueError(
                    f"quotas.max_live_models_per_user{where} {live} must be below engine.max_models_per_base {slots}: "
                    "else one user can fill every model slot of a trainer"
                )
        return self

    def resolved(self) -> ServerConfig:
        """A copy with every local path made absolute (Ray Train workers change directory)."""
        state = str(Path(self.state_dir).resolve())
        models = [
            m.model_copy(update={"path": str(Path(m.path).resolve()) if m.builds_embedded() else _abs_if_local(m.path)})
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
