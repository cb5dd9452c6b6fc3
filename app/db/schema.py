"""The metadata database: its tables (as this release needs them; app/db/migrations brings a database there) and
connecting to it."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    Float,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    event,
)
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import ConnectionPoolEntry

metadata = MetaData()

futures = Table(
    "futures",
    metadata,
    Column("request_id", String(64), primary_key=True),
    Column("kind", String(32), nullable=False),
    # what it belongs to: a model (training run), a sampling session or a custom loss; each id starts with its session's
    Column("subject_id", String(200)),
    Column("seq_id", BigInteger),  # sampling seq_ids of cloned clients exceed 2**32
    Column("state", String(16), nullable=False),  # pending | completed | failed
    Column("content_type", String(64)),
    Column("payload", LargeBinary),
    Column("error", JSON),
    Column("created_at", Float, nullable=False),
    Column("completed_at", Float),
    Index("ux_futures_subject_seq", "subject_id", "seq_id", unique=True),
    # a user's pending operations (app.db.quotas), per request
    Index("ix_futures_state_subject", "state", "subject_id"),
)

sessions = Table(
    "sessions",
    metadata,
    Column("session_id", String(64), primary_key=True),
    Column("created_at", Float, nullable=False),
    Column("last_heartbeat", Float, nullable=False),
    Column("finished_reason", String(32)),
    Column("sdk_version", String(32)),
    Column("tags", JSON),
    Column("user_metadata", JSON),
    Column("owner", String(64), index=True),  # the user (app.api.auth.user_id_of); null: made before users existed
)

training_runs = Table(
    "training_runs",
    metadata,
    Column("model_id", String(200), primary_key=True),
    Column("session_id", String(64), nullable=False),
    Column("base_model", String(200), nullable=False),
    Column("lora_rank", Integer, nullable=False),
    Column("role", String(16), nullable=False),
    Column("trainer", String(220), nullable=False, index=True),  # the routing table: model_id -> (trainer, role)
    Column("lora_config", JSON, nullable=False),
    Column("user_metadata", JSON),
    Column("created_at", Float, nullable=False),
    Column("unloaded", Integer, nullable=False, default=0),
    Index("ix_training_runs_base_model", "base_model"),  # search_checkpoints' base_models (revision 0008)
)

sampling_sessions = Table(
    "sampling_sessions",
    metadata,
    Column("sampling_session_id", String(200), primary_key=True),
    Column("session_id", String(64), nullable=False),
    Column("base_model", String(200), nullable=False),
    Column("model_path", String(400)),  # tinker:// path; null for the base model
    Column("adapter_location", String(1000)),  # the adapter's storage location; null for the base model
    Column("ephemeral", Integer, nullable=False, default=0),
    Column("created_at", Float, nullable=False),
    Column("last_used_at", Float, nullable=False),
)

checkpoints = Table(
    "checkpoints",
    metadata,  # a row is what makes a checkpoint exist: its files are written (at `location`) before it
    Column("model_id", String(200), primary_key=True),
    Column("kind", String(32), primary_key=True),
    Column("name", String(128), primary_key=True),
    Column("location", String(600), nullable=False),  # under the storage root; written once, never changed
    Column("size_bytes", BigInteger, nullable=False),
    Column("created_at", Float, nullable=False, index=True),
    Column("expires_at", Float, index=True),  # null: never
    Column("public", Integer, nullable=False, default=0),
    Column("user_metadata", JSON),
    # search_checkpoints walks checkpoints newest first, then by path (revision 0008)
    Index("ix_checkpoints_created_path", "created_at", "model_id", "kind", "name"),
)

stability_records = Table(
    "stability_records",
    metadata,  # what stable_reinforce needs of each sequence sampled with record_stability_info
    Column("sequence_id", String(200), primary_key=True),  # SampledSequence.sequence_id: {request_id}:{i}
    Column("session_id", String(64), nullable=False, index=True),  # records are scoped to their session
    Column("adapter_location", String(1000)),  # the weights that sampled it (null: the base model)
    Column("prompt", LargeBinary, nullable=False),  # int32 tokens
    Column("tokens", LargeBinary, nullable=False),  # int32 sampled tokens
    Column("logprobs", LargeBinary, nullable=False),  # float32 sampler logprob of each sampled token
    Column("created_at", Float, nullable=False),
    Column("last_used_at", Float, nullable=False, index=True),
)

sample_completions = Table(
    "sample_completions",
    metadata,  # each sampling session's completion queue (retrieve_futures), one per clone of its client
    Column("sampling_session_id", String(200), primary_key=True),
    Column("clone_id", BigInteger, primary_key=True),  # seq_id // 1e9: 0 for the original client
    Column("cursor", BigInteger, primary_key=True),  # 1, 2, ... within the queue, in the order of completion
    Column("request_id", String(64), nullable=False),
    Column("state", String(16), nullable=False),  # finished | failed
    Column("payload_size", BigInteger),
)

sampling_clients = Table(
    "sampling_clients",
    metadata,  # client ids allocated by join_sampling_session (the original client is 0)
    Column("sampling_session_id", String(200), primary_key=True),
    Column("client_counter", BigInteger, primary_key=True),
)

session_labels = Table(
    "session_labels",
    metadata,  # what a session was created with for display and search, and the project it was moved into
    Column("session_id", String(64), primary_key=True),
    Column("project_id", String(200), index=True),
    Column("display_name", String(400)),
)

session_requests = Table(
    "session_requests",
    metadata,  # which session each future belongs to (the trace export reads their timings from `futures`);
    # trimmed to retention.max_trace_events_per_session per session by a sweep
    Column("request_id", String(64), primary_key=True),
    Column("session_id", String(64), nullable=False),
    Column("created_at", Float, nullable=False),
    Index("ix_session_requests_session_created", "session_id", "created_at"),
)

usage_hours = Table(
    "usage_hours",
    metadata,  # tokens trained and sampled, per UTC hour, session, base model and kind (app.db.usage)
    Column("bucket_start", Float, primary_key=True),
    Column("session_id", String(64), primary_key=True),
    Column("base_model", String(200), primary_key=True),
    Column("kind", String(32), primary_key=True),  # training | sampling_prefill | sampling_sample
    Column("token_count", BigInteger, nullable=False),
)

copy_requests = Table(
    "copy_requests",
    metadata,  # copy_weights by X-Idempotency-Key: a retried copy answers the first copy's path
    Column("idempotency_key", String(200), primary_key=True),
    Column("tinker_path", String(400), nullable=False),
    Column("created_at", Float, nullable=False),
)

external_uploads = Table(
    "external_uploads",
    metadata,  # adapters being uploaded (external_weights_upload_start); unfinished ones expire (app.api.uploads)
    Column("upload_id", String(64), primary_key=True),
    Column("owner", String(64), nullable=False, index=True),
    Column("base_model", String(200), nullable=False),
    Column("spec", JSON, nullable=False),  # the AdapterSpec the adapter must match
    Column("project_id", String(200)),
    Column("files", JSON, nullable=False),  # file name -> the most bytes it may hold
    Column("reserved_bytes", BigInteger, nullable=False),  # held against the owner's checkpoint bytes until finished
    Column("created_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False, index=True),
    Column("tinker_path", String(400)),  # the checkpoint it made; null: unfinished
)

custom_losses = Table(
    "custom_losses",
    metadata,  # losses made by create_custom_loss, validated; any replica resolves a loss_id through this
    Column("loss_id", String(200), primary_key=True),  # {session_id}:loss:{custom_loss_seq_id}
    Column("session_id", String(64), nullable=False, index=True),  # a loss is used only by its session
    Column("name", String(200), nullable=False),
    Column("program", Text, nullable=False),  # the validated graph as JSON (CustomLossProgram.to_json)
    Column("created_at", Float, nullable=False),
)

users = Table(
    "users",
    metadata,  # people given keys by `tinker-serve keys create` (keys enrolled on first use have none)
    Column("name", String(64), primary_key=True),  # the owner id of their sessions
    Column("created_at", Float, nullable=False),
)

api_keys = Table(
    "api_keys",
    metadata,  # every key the server knows, by the SHA-256 of the secret (the secret itself is never stored)
    Column("key_id", Integer, primary_key=True, autoincrement=True),
    Column("key_hash", String(64), nullable=False, unique=True),
    Column("owner", String(64), nullable=False, index=True),  # a users.name, or user-<hash> for an enrolled key
    Column("name", String(200), nullable=False),
    Column("hint", String(16), nullable=False),  # the secret's last 4 characters, to tell keys apart in lists
    Column("origin", String(16), nullable=False),  # issued | enrolled (a tml- key on loopback) | configured
    Column("created_at", Float, nullable=False),
    Column("last_used_at", Float),
    Column("expires_at", Float),  # null: never
    Column("revoked_at", Float),
)

audit_events = Table(
    "audit_events",
    metadata,  # append-only: rows are inserted (app.db.audit), never changed or removed
    Column("event_id", Integer, primary_key=True, autoincrement=True),
    Column("at", Float, nullable=False, index=True),
    Column("event", String(64), nullable=False),  # <resource>_<action>, e.g. checkpoint_published
    Column("actor", String(64), nullable=False, index=True),  # the user who did it, or "console"
    Column("subject_owner", String(64), index=True),  # whose object it concerns, when not the actor's
    Column("details", JSON, nullable=False),
)

settings = Table(
    "settings",
    metadata,  # server-wide values every replica shares (e.g. the download-URL signing key)
    Column("key", String(64), primary_key=True),
    Column("value", String(1000), nullable=False),
)

journal = Table(
    "journal",
    metadata,  # every operation the ingress accepted for a model, in seq_id order, until a snapshot covers it:
    # what rebuilds the model after a worker, the trainer or the whole app restarts (app.db.journal)
    Column("model_id", String(200), primary_key=True),
    Column("seq_id", BigInteger, primary_key=True),  # 0: the model's creation
    Column("request_id", String(64), nullable=False),  # its future: completed ones are replayed, pending ones rerun
    Column("op", LargeBinary, nullable=False),  # the operation (app.messages): app.db.journal_codec
    Column("created_at", Float, nullable=False),
    # how often the training workers died while it ran: at timeouts.max_worker_deaths_per_operation it fails
    Column("worker_deaths", Integer, nullable=False, server_default="0"),
    # a forward_backward that ran in one pass with other models': that pass's shape (app.messages.PassLayout), what
    # replays it bit for bit
    Column("layout", LargeBinary, nullable=True),
)

snapshots = Table(
    "snapshots",
    metadata,  # each live model's latest snapshots (adapter + optimizer state), taken by the trainer unasked
    Column("model_id", String(200), primary_key=True),
    Column("seq_id", BigInteger, primary_key=True),  # the operation it follows: replay starts after it
    Column("location", String(600), nullable=False),  # under the storage root; published atomically
    Column("created_at", Float, nullable=False),
)

run_history = Table(
    "run_history",
    metadata,  # each model's training steps as they finished: what a run's curves are drawn from (app.db.history)
    Column("model_id", String(200), primary_key=True),
    Column("seq_id", BigInteger, primary_key=True),
    Column("kind", String(32), nullable=False),  # forward_backward | forward | optim_step
    Column("at", Float, nullable=False),
    Column("step", Integer, nullable=False),  # optim_steps finished before (a forward_backward) or with it
    Column("tokens", BigInteger, nullable=False),  # a forward(_backward)'s input tokens; 0 for an optim_step
    Column("learning_rate", Float),  # an optim_step's
    Column("metrics", JSON, nullable=False),  # what the loss (or optimizer) returned: loss:sum and the rest
)

schema_info = Table(
    "schema_info",
    metadata,  # releases before Alembic kept their schema version here; 6 makes them refuse this database
    Column("version", Integer, primary_key=True),
)


def connect(url: str) -> AsyncEngine:
    """A connection pool to the database at `url` (SQLAlchemy's async engine); SQLite files get WAL and a busy
    timeout so several processes can share them, and one connection per process: SQLite takes one writer at a
    time, and a writer that finds another connection's write lock sleeps in SQLite's busy handler (1, 2, 5, 10 ms
    and up), where queueing for the pool's one connection costs nothing (8 concurrent writes: 40-60 ms -> 7-15)."""
    if url.startswith("sqlite"):
        db_path = url.split(":///", 1)[1]
        Path(db_path).parent.mkdir(parents=True, exist_ok=True)
        db = create_async_engine(url, connect_args={"timeout": 30}, pool_size=1, max_overflow=0, pool_timeout=60)

        @event.listens_for(db.sync_engine, "connect")
        def _sqlite_pragmas(dbapi_conn: DBAPIConnection, _record: ConnectionPoolEntry) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return db
    return create_async_engine(url, pool_pre_ping=True)
