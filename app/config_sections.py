"""The server-wide sections of the configuration (app.config.ServerConfig): what one request may ask (`limits`), how
long the server waits and how often it tries again (`timeouts`), how long it keeps what it stores (`retention`),
what one user, key, session or base model may hold or send at once (`quotas`), the widths of the engines every
base model runs (`engine`), which labels the server's metrics carry (`metrics`) and where image pointers may point
(`images`). Each field's description says what it bounds; validation reads no file."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, model_validator

ASSET_STORE_SCHEMES = ("s3", "gs")  # object stores an image asset root may name (app.images.assets)


class Strict(BaseModel):
    """Unknown keys are errors; a validated config never changes."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class LimitsConfig(Strict):
    """Per-request size and shape limits; each is enforced with a user error naming the field."""

    max_datums_per_request: int = Field(1024, ge=1, description="datums of one forward(_backward) request")
    max_tokens_per_datum: int | None = Field(
        None,
        ge=2,
        description="tokens of one datum; None: each base model's max_context_length (its context), a number caps it",
    )
    max_request_bytes: int = Field(
        64 * 2**20, ge=1024, description="a forward(_backward) body in bytes, as sent and after decompression"
    )
    max_sample_request_bytes: int = Field(
        16 * 2**20, ge=1024, description="an asample or /v1/ body in bytes (prompts with images)"
    )
    max_control_request_bytes: int = Field(2**20, ge=1024, description="every other route's body in bytes")
    fwdbwd_max_chunk_len: int = Field(
        1024,
        ge=1,
        description="the SDK sends a forward(_backward) in requests of at most this many datums (client/config)",
    )
    max_num_samples: int = Field(64, ge=1, description="asample num_samples (on /v1/: prompts x n)")
    max_sample_tokens: int = Field(4096, ge=1, description="asample sampling_params.max_tokens (/v1/: max_tokens)")
    default_sample_tokens: int = Field(256, ge=1, description="the sample token budget when a request leaves it out")
    max_topk_logprobs: int = Field(
        20, ge=0, description="topk_prompt_logprobs and topk_sample_logprobs (/v1/: logprobs, top_logprobs)"
    )
    max_sample_temperature: float = Field(
        2.0, gt=0, description="asample's and the /v1/ routes' temperature above it is refused"
    )
    max_user_metadata_bytes: int = Field(
        16384, ge=2, description="a checkpoint's user_metadata (and a session's tags, user_metadata), as JSON"
    )
    max_listing_metadata_bytes: int = Field(
        2**20,
        ge=1024,
        description="the user_metadata of one page of GET /training_runs or GET /checkpoints, as JSON, shared "
        "equally by its items: an item's beyond its share is cut (user_metadata_truncated: true); a smaller page "
        "shows it whole",
    )
    max_usage_window_hours: int = Field(
        14 * 24, ge=1, description="billing/usage/events: the widest window asked for at once"
    )
    max_custom_loss_nodes: int = Field(512, ge=4, description="nodes of one traced custom loss graph")
    max_custom_loss_elements: int = Field(
        2**24, ge=1024, description="elements of any tensor a custom loss computes, per datum"
    )
    max_custom_loss_flops_per_request: int = Field(
        2**40,
        ge=2**20,
        description=(
            "a custom loss's FLOPs over one request, estimated from the datums' lengths before any node runs (matrix "
            "products as torch counts them, else elements read and written). Realistic losses (tens of element-wise "
            "nodes over [T] or [T, K]) take under 10^3 FLOPs a token, ~10^10 for the largest request; 2^40 "
            "(~1.1e12) leaves 100x beyond that, and refuses e.g. a [T, T] matmul per datum at T=2048 (~1.7e10 FLOPs "
            "each) past 64 datums"
        ),
    )
    max_custom_loss_integer: int = Field(
        2**53,
        ge=2**31,
        description=(
            "the magnitude of any integer in a custom loss: its literals, refused at create_custom_loss, and what its "
            "arithmetic on plain numbers (sizes read from shapes) computes, refused before a power computes past it "
            "and after any other node. Python's integers grow without end (7 ** 10**9 takes hours); 2^53 is the "
            "largest a float64 holds exactly, and the journal holds 64 bits (a loss with more is refused)"
        ),
    )
    max_custom_loss_seconds: float = Field(
        30.0,
        gt=0,
        description=(
            "a custom loss's time on one rank for one request (its planning on the meta device and its nodes; the "
            "model's passes not counted), checked between nodes: past it the operation fails as a user error and "
            "the rank goes on serving. One node alone is bounded by max_custom_loss_elements, "
            "max_custom_loss_flops_per_request and max_custom_loss_integer"
        ),
    )
    max_loss_input_cells_per_request: int = Field(
        2**25,
        ge=1,
        description=(
            "forward(_backward) loss_fn_inputs, checked from declared shapes before any datum is decoded: cells of "
            "all tensors of one request, a sparse CSR one counted densified (2**25: what a dense bf16 body of "
            "max_request_bytes could carry; raise the two together)"
        ),
    )
    max_sparse_input_width: int = Field(
        1024, ge=1, description="the K of an (N, K) loss input sent as sparse CSR (top-k inputs: K is small)"
    )
    # images on a vision-language base, checked from each image's header before it is decoded (app.images.checks)
    max_image_bytes: int = Field(8 * 2**20, ge=1024, description="one image chunk's encoded bytes (png or jpeg)")
    max_image_pixels: int = Field(
        40_000_000,
        ge=1024,
        description="one image's width x height as its header declares it (a small file may claim 100 megapixels)",
    )
    max_images_per_request: int = Field(
        256, ge=1, description="image chunks of one forward(_backward) request, all datums together"
    )
    max_vision_tokens_per_datum: int = Field(
        16384, ge=1, description="vision tokens (image pads) of one datum's images, as its base's processor counts them"
    )
    max_images_per_prompt: int = Field(
        4,
        ge=1,
        description="images in one asample prompt or /v1/chat/completions request: vLLM's per-prompt limit on a "
        "vision-language base, whose start profiles that many (256 took a tiny base's Sampler 158 s to start, 2 54 s)",
    )
    # forward(_backward) counts, checked from the wire before anything is built from them (app.protocol.bounds)
    max_chunks_per_datum: int = Field(
        2**16, ge=1, description="model_input chunks of one forward(_backward) datum (one per token still fits 64k)"
    )
    max_chunks_per_request: int = Field(
        2**18, ge=1, description="model_input chunks of all datums of one forward(_backward) request"
    )
    max_loss_fn_inputs_per_datum: int = Field(
        64, ge=1, description="loss_fn_inputs entries of one forward(_backward) datum (the built-in losses take <= 4)"
    )
    max_loss_fn_config_entries: int = Field(
        64, ge=1, description="loss_fn_config entries (with loss_fn_config_v2's) of one forward(_backward) request"
    )
    max_provenance_spans_per_request: int = Field(
        2**16, ge=1, description="provenance spans (model_input_spans and loss_fn_input_spans) of one request"
    )
    max_distinct_sequence_ids_per_request: int = Field(
        2**14,
        ge=1,
        description="distinct sequence ids one request's provenance spans name: each is a stability record read",
    )
    # request fields bounded while the body is validated (app.protocol.field_limits), before a handler runs
    max_stop_sequences: int = Field(
        64,
        ge=1,
        description="stop strings or stop token ids of one sample (asample sampling_params.stop; /v1/: stop, "
        "stop_token_ids) and /v1/ bad_words: the sampler checks each after every token",
    )
    max_stop_chars: int = Field(
        4096, ge=1, description="characters of one sample's stop strings together (and of /v1/ bad_words)"
    )
    max_logit_bias_entries: int = Field(
        1024, ge=1, description="/v1/ logit_bias and allowed_token_ids entries (each is applied at every token)"
    )
    max_structured_output_bytes: int = Field(
        65536,
        ge=64,
        description="/v1/ structured outputs (response_format, structured_outputs, guided_json, guided_regex, "
        "guided_grammar, guided_choice), as JSON: the schema, regex or grammar the sampler compiles",
    )
    max_search_terms: int = Field(
        32,
        ge=1,
        le=256,  # SQLite refuses an expression deeper than 1000
        description="sessions/search: display_name words, user_metadata pairs, statuses; checkpoints/search: "
        "user_metadata pairs, base_models (each is one filter)",
    )
    max_checkpoint_search_page: int = Field(
        200, ge=1, description="checkpoints/search: checkpoints in one page, the request's limit (the SDK sends 1-200)"
    )
    max_retrieved_request_ids: int = Field(
        65536, ge=1, description="retrieve_futures retrieved_request_ids (the SDK acknowledges its results)"
    )

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, data: Any) -> Any:
        """A config written before the split names each field that left `limits` with its new place."""
        if isinstance(data, dict):
            moved = [
                f"limits.{name} moved to {MOVED_FROM_LIMITS[name]}.{name}" for name in data if name in MOVED_FROM_LIMITS
            ]
            if moved:
                raise ValueError("; ".join(moved))
        return data


class TimeoutsConfig(Strict):
    """How long the server waits for something, and how often it tries again."""

    long_poll_seconds: float = Field(
        20.0, gt=0, le=40, description="how long retrieve_future(s) holds a poll (the SDK's poll timeout is 45 s)"
    )
    command_timeout_seconds: float = Field(
        900.0, gt=0, description="one message to the training workers, their start-up excluded"
    )
    handover_check_seconds: float = Field(
        10.0,
        gt=0,
        description="how often each ingress replica asks the trainers for journaled operations pending at least "
        "this long that they never received (an ingress replica killed between answering a request and handing it "
        "over), and hands those over again",
    )
    worker_start_timeout_seconds: float = Field(
        600.0,
        gt=0,
        description=(
            "a worker group's start or restart: Ray Train's wait for its resources (it would give up after 60 s) and "
            "each rank's loading of the base model"
        ),
    )
    max_worker_deaths_per_operation: int = Field(
        2,
        ge=1,
        description=(
            "an operation running each time the training workers died this often (killed for memory, most likely) "
            "fails with a user error instead of being resent to kill them again (app.trainer.worker_deaths)"
        ),
    )
    seq_gap_timeout_seconds: float = Field(
        330.0, gt=0, description="operations waiting behind a seq_id that never arrived run after this long"
    )
    sample_timeout_seconds: float = Field(
        900.0,
        ge=10,
        description="a sample still pending this long is failed (its sampler died along with the ingress that would "
        "have noticed)",
    )
    sample_retries: int = Field(
        3, ge=0, description="a sample whose Sampler replica died is sent again this often at most"
    )
    sample_retry_deadline_seconds: float = Field(
        300.0,
        gt=0,
        description="and answered within this long of the death, or failed as a server error (a replacement replica "
        "starts vLLM first: 20-60 s on CPU)",
    )
    session_timeout_seconds: float = Field(
        300.0,
        ge=30,
        description="silent this long (SDKs beat every 10 s), a session expires and its models are unloaded; their "
        "checkpoints stay",
    )


class RetentionConfig(Strict):
    """How long what the server stores is kept, how much of it, and how often sweeps remove the rest."""

    ephemeral_sampler_ttl_seconds: float = Field(
        3600.0, gt=0, description="unused this long, an ephemeral sampler expires"
    )
    min_checkpoint_ttl_seconds: int = Field(
        3600, ge=1, description="checkpoint ttl_seconds below it are refused (the hosted minimum)"
    )
    max_checkpoint_ttl_seconds: int = Field(
        10 * 365 * 86400, ge=1, description="checkpoint ttl_seconds above it are refused"
    )
    checkpoint_sweep_seconds: float = Field(60.0, gt=0, description="how often expired checkpoints' files are removed")
    download_url_ttl_seconds: int = Field(
        3600, ge=60, description="signed links (external_weights_urls, trace exports) stay valid this long"
    )
    stability_record_ttl_seconds: float = Field(
        3600.0, ge=1, description="unused this long, a stability record expires"
    )
    max_trace_events_per_session: int = Field(
        10_000, ge=1, description="requests kept for a session's trace export; a sweep removes older ones"
    )
    max_history_points_per_run: int = Field(
        20_000, ge=1, description="a run's recorded steps (app.db.history); the oldest go"
    )
    future_retention_seconds: float = Field(
        7 * 86400.0,
        ge=60,
        description="a finished future's row and result are removed this long after it finished (SDKs fetch results "
        "in seconds); futures a model's journal still replays stay",
    )
    audit_retention_days: float = Field(90.0, gt=0, description="audit events older than this are removed")
    audit_read_dedupe_seconds: float = Field(
        3600.0,
        ge=0,
        description="another user's published checkpoint read by one user for one purpose is audited once this "
        "often, per ingress replica",
    )
    metadata_retention_seconds: float = Field(
        30 * 86400.0,
        ge=60,
        description="a finished session's tags and user_metadata, and an unloaded run's user_metadata, are removed "
        "this long after they were created; until then they count against quotas.max_*_per_user",
    )

    @model_validator(mode="after")
    def _check(self) -> RetentionConfig:
        if self.min_checkpoint_ttl_seconds > self.max_checkpoint_ttl_seconds:
            raise ValueError("retention.min_checkpoint_ttl_seconds exceeds retention.max_checkpoint_ttl_seconds")
        return self


class UserQuotas(Strict):
    """One user's own *_per_user quotas (`quotas.users`); a field left out keeps the server-wide value."""

    max_live_models_per_user: int | None = Field(
        None, ge=1, description="quotas.max_live_models_per_user, for this user"
    )
    max_checkpoint_bytes_per_user: int | None = Field(
        None, ge=1, description="quotas.max_checkpoint_bytes_per_user, for this user"
    )
    max_pending_requests_per_user: int | None = Field(
        None, ge=1, description="quotas.max_pending_requests_per_user, for this user"
    )
    max_pending_bytes_per_user: int | None = Field(
        None, ge=1, description="quotas.max_pending_bytes_per_user, for this user"
    )
    max_sessions_per_user: int | None = Field(None, ge=1, description="quotas.max_sessions_per_user, for this user")
    max_training_runs_per_user: int | None = Field(
        None, ge=1, description="quotas.max_training_runs_per_user, for this user"
    )
    max_metadata_bytes_per_user: int | None = Field(
        None, ge=2, description="quotas.max_metadata_bytes_per_user, for this user"
    )
    max_ephemeral_samplers_per_user: int | None = Field(
        None, ge=1, description="quotas.max_ephemeral_samplers_per_user, for this user"
    )
    max_stability_record_bytes_per_user: int | None = Field(
        None, ge=1, description="quotas.max_stability_record_bytes_per_user, for this user"
    )
    max_long_polls_per_user: int | None = Field(None, ge=1, description="quotas.max_long_polls_per_user, for this user")
    max_concurrent_decodes_per_user: int | None = Field(
        None, ge=1, description="quotas.max_concurrent_decodes_per_user, for this user"
    )
    sample_tokens_per_minute_per_user: int | None = Field(
        None, ge=1, description="quotas.sample_tokens_per_minute_per_user, for this user"
    )
    max_pending_samples_per_user: int | None = Field(
        None, ge=1, description="quotas.max_pending_samples_per_user, for this user"
    )


class QuotasConfig(Strict):
    """What one user, key, client, session or base model may hold or send at once. Sizes are refused with a user
    error naming the field; rates and queues with 429 and Retry-After, which the SDK waits out."""

    max_live_models_per_user: int = Field(
        32,
        ge=1,
        description="models not unloaded, across the user's sessions; below engine.max_models_per_base, so that no "
        "one user fills a trainer",
    )
    max_checkpoint_bytes_per_user: int = Field(
        2**40, ge=1, description="bytes of the user's live checkpoints; a save beyond it is refused"
    )
    decode_processes: int = Field(
        2,
        ge=1,
        description="processes of each ingress replica that decode forward(_backward) bodies, off its event loop",
    )
    max_concurrent_decodes_per_user: int = Field(
        1,
        ge=1,
        description="forward(_backward) bodies of one user decoded at once in an ingress replica (more wait their "
        "turn); below decode_processes, so that no one user fills the decoders",
    )
    max_pending_requests_per_user: int = Field(
        1024, ge=1, description="the user's training operations queued or running"
    )
    max_pending_bytes_per_user: int = Field(
        2**30, ge=1, description="their batches' decoded bytes, held until they run"
    )
    max_long_polls_per_user: int = Field(
        256, ge=1, description="retrieve_future(s) calls waiting at once, per ingress replica"
    )
    sample_tokens_per_minute_per_user: int = Field(
        10_000_000,
        ge=1,
        description="sampled tokens (num_samples x max_tokens) and prompt tokens per minute, per ingress replica",
    )
    requests_per_minute_per_key: int = Field(
        60_000, ge=1, description="every call, long-polls included, per API key and ingress replica"
    )
    failed_auth_per_minute_per_client: int = Field(
        600, ge=1, description="refused keys per client address and ingress replica; beyond it the client waits"
    )
    keyless_requests_per_minute_per_client: int = Field(
        600,
        ge=1,
        description="requests that need no key but read files (signed download and trace links; /hub without a key "
        "on loopback), per client address and ingress replica; beyond it 429",
    )
    max_custom_losses_per_session: int = Field(256, ge=1, description="create_custom_loss beyond it is refused")
    max_stability_records_per_session: int = Field(
        200_000, ge=1, description="live stability records; a recording asample beyond it is refused"
    )
    max_pending_samples: int = Field(
        512, ge=1, description="samples queued per base model and ingress replica; beyond it asample gets 429"
    )
    max_pending_samples_per_user: int | None = Field(
        None,
        ge=1,
        description="a user's fair share of max_pending_samples (default: a quarter of it); past it their asample "
        "or /v1 request gets 429 unless that share of the pool stays free for the others",
    )
    max_sessions_per_user: int = Field(
        10_000,
        ge=1,
        description="sessions kept: open, or created within retention.metadata_retention_seconds; create_session "
        "beyond it is refused",
    )
    max_training_runs_per_user: int = Field(
        10_000,
        ge=1,
        description="training runs kept: live, or created within retention.metadata_retention_seconds; a new model "
        "beyond it is refused",
    )
    max_metadata_bytes_per_user: int = Field(
        16 * 2**20,
        ge=2,
        description="tags and user_metadata (as JSON) kept by the user's sessions and runs; a session or model "
        "whose metadata goes beyond it is refused",
    )
    max_ephemeral_samplers_per_user: int = Field(
        256,
        ge=1,
        description="live ephemeral samplers (save_weights_and_get_sampling_client); they expire after "
        "retention.ephemeral_sampler_ttl_seconds unused",
    )
    max_stability_record_bytes_per_user: int = Field(
        2**30,
        ge=1,
        description="bytes of live stability records (per sequence: 4 a prompt token, 8 a sampled token); a "
        "recording asample that could go beyond it is refused",
    )
    users: dict[str, UserQuotas] = Field(
        {},
        description="per-user overrides of the *_per_user quotas, by user (an issued key's --user, or the user-... "
        "id an enrolled key shows in the console): e.g. {alice: {max_live_models_per_user: 48}}",
    )

    def for_user(self, user: str) -> QuotasConfig:
        """These quotas with `user`'s overrides (`users`) applied."""
        override = self.users.get(user)
        return self if override is None else self.model_copy(update=override.model_dump(exclude_none=True))


class EngineConfig(Strict):
    """What sizes every base model's trainers and samplers (the same for all base models)."""

    max_lora_rank: int = Field(
        32,
        ge=1,
        description="the largest lora_config.rank accepted, and the samplers' LoRA width: vLLM pads every adapter to "
        "it, so it sets the memory and speed of sampling",
    )
    max_models_per_base: int = Field(
        64, ge=1, description="models (adapters with their optimizer state) one trainer holds at once"
    )


class UploadsConfig(Strict):
    """Uploading LoRA adapters trained elsewhere (external_weights_upload_start / _finish, SDK 0.39+)."""

    enabled: bool = Field(True, description="whether users may upload adapters; off: both routes answer 403")
    url_ttl_seconds: int = Field(
        3600, ge=60, description="an upload's signed PUT URLs stay valid this long; unfinished, it expires then"
    )
    max_config_bytes: int = Field(64 * 2**10, ge=1024, description="the largest adapter_config.json accepted")
    max_header_bytes: int = Field(
        2**20, ge=1024, description="the largest safetensors header of adapter_model.safetensors accepted"
    )
    sweep_seconds: float = Field(60.0, gt=0, description="how often expired uploads' files are removed")


class ImagesConfig(Strict):
    """Image chunks that point at a location (`image_asset_pointer`): where they may point. The server fetches
    nothing from the network; it reads a pointed image from the operator's own directories and object stores."""

    asset_roots: list[str] = Field(
        [],
        description="the locations image_asset_pointer chunks may name: local directories (an absolute path or a "
        "file:// URL; a pointer's path is resolved, symlinks and `..` included, before it is checked to lie inside "
        "one) and object-store prefixes (s3://bucket/prefix or gs://bucket/prefix, a pyarrow.fs URI whose query may "
        "set region or endpoint_override; read with the server's storage credentials from the environment). Empty: "
        "every pointer is refused",
    )

    @model_validator(mode="after")
    def _check_roots(self) -> ImagesConfig:
        for root in self.asset_roots:
            parts = urlsplit(root)
            local = root.startswith(("/", "file:///"))
            if not (local or (parts.scheme in ASSET_STORE_SCHEMES and parts.netloc)):
                raise ValueError(
                    f"images.asset_roots entry {root!r} must be an absolute path, a file:/// URL or an "
                    f"{' or '.join(f'{s}://bucket[/prefix]' for s in ASSET_STORE_SCHEMES)} URI"
                )
        return self


class MetricsConfig(Strict):
    """The labels of the server's Prometheus metrics (docs/reference/metrics.md). A label per user or per model keeps
    a time series per value for as long as Prometheus keeps its data, so both are off by default (one series, value
    `all`) and capped when on."""

    per_user_labels: bool = Field(
        False, description="label tinker_serve_user_requests by user id; off: every user counts under user `all`"
    )
    per_model_labels: bool = Field(
        False,
        description="label tinker_serve_queue_depth by model_id; off: each trainer's models are summed under model_id "
        "`all`",
    )
    max_label_values: int = Field(
        100,
        ge=1,
        description="with a label on: the distinct users (and model ids) each process names, the first it sees; the "
        "rest are counted (summed) under `other`",
    )


SECTIONS: dict[str, type[Strict]] = {
    "limits": LimitsConfig,
    "timeouts": TimeoutsConfig,
    "retention": RetentionConfig,
    "quotas": QuotasConfig,
    "engine": EngineConfig,
}
# every field that `limits` held before it was split, by the section that holds it now
MOVED_FROM_LIMITS: dict[str, str] = {
    name: section for section, model in SECTIONS.items() if section != "limits" for name in model.model_fields
}
