"""The metadata database: its tables, connecting to it, and bringing an older schema up to date in place."""

from __future__ import annotations

import asyncio
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
    insert,
    inspect,
    select,
    text,
    update,
)
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import ConnectionPoolEntry

metadata = MetaData()

futures = Table(
    "futures",
    metadata,
    Column("request_id", String(64), primary_key=True),
    Column("kind", String(32), nullable=False),
    Column("model_id", String(200)),
    Column("seq_id", BigInteger),  # sampling seq_ids of cloned clients exceed 2**32
    Column("state", String(16), nullable=False),  # pending | completed | failed
    Column("content_type", String(64)),
    Column("payload", LargeBinary),
    Column("error", JSON),
    Column("created_at", Float, nullable=False),
    Column("completed_at", Float),
    Index("ux_futures_model_seq", "model_id", "seq_id", unique=True),
    Index("ix_futures_state_model", "state", "model_id"),  # a user's pending operations (app.db.quotas), per request
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
    # trimmed to limits.max_trace_events_per_session per session by a sweep
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

schema_info = Table("schema_info", metadata, Column("version", Integer, primary_key=True))
SCHEMA_VERSION = 5  # 1: before checkpoint rows (stops up to 9); 2: training_runs.last_seq_id (never read);
# 3: before stability_records; 4: before sessions.owner, users, api_keys and audit_events. Statements that bring
# a database of version v to v + 1 in place (new tables need none: create_all adds them).
_UPGRADES: dict[int, tuple[str, ...]] = {
    2: ("ALTER TABLE training_runs DROP COLUMN last_seq_id",),
    3: (),
    4: (
        "ALTER TABLE sessions ADD COLUMN owner VARCHAR(64)",
        "CREATE INDEX ix_sessions_owner ON sessions (owner)",
        "CREATE INDEX ix_futures_state_model ON futures (state, model_id)",
    ),
}


class SchemaMismatch(RuntimeError):
    """The database was made by another tinker-serve version."""


def connect(url: str) -> AsyncEngine:
    """A connection pool to the database at `url` (SQLAlchemy's async engine); SQLite files get WAL and a busy
    timeout so several processes can share them."""
    if url.startswith("sqlite"):
        db_path = url.split(":///", 1)[1]
        Path(db_path).parent.mkdir(parents=True, exist_ok=True)
        db = create_async_engine(url, connect_args={"timeout": 30})

        @event.listens_for(db.sync_engine, "connect")
        def _sqlite_pragmas(dbapi_conn: DBAPIConnection, _record: ConnectionPoolEntry) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return db
    return create_async_engine(url, pool_pre_ping=True)


async def create_tables(db: AsyncEngine) -> None:
    """Create missing tables, upgrade an older schema in place where an upgrade exists, then check the version:
    a database nothing can upgrade (or a newer one) is refused with a message that says what to do."""
    existing, version = await _create_missing_tables(db)
    if version is None and "futures" in existing and "schema_info" not in existing:
        version = 1  # made before versions were recorded
    if version is None:
        try:
            async with db.begin() as conn:
                await conn.execute(insert(schema_info).values(version=SCHEMA_VERSION))
        except IntegrityError:  # another replica recorded it first
            pass
        async with db.connect() as conn:
            version = await conn.scalar(select(schema_info.c.version))
    while version in _UPGRADES:
        version = await _upgrade(db, version)
    if version != SCHEMA_VERSION:
        raise SchemaMismatch(
            f"the state database {db.url.render_as_string(hide_password=True)} has schema version {version}, "
            f"and this tinker-serve needs {SCHEMA_VERSION}; start with a fresh state_dir (or database_url), or use the "
            "tinker-serve version that made it"
        )


async def _create_missing_tables(db: AsyncEngine, attempts: int = 5) -> tuple[set[str], int | None]:
    """(the tables there were before, the recorded schema version) after creating the missing tables. Replicas
    starting together race to create them ("table ... already exists"); the loser looks again."""
    for attempt in range(1, attempts):
        try:
            return await _create_all(db)
        except (OperationalError, ProgrammingError, IntegrityError):
            await asyncio.sleep(0.1 * attempt)
    return await _create_all(db)


async def _create_all(db: AsyncEngine) -> tuple[set[str], int | None]:
    async with db.begin() as conn:
        existing = set(await conn.run_sync(lambda sync: inspect(sync).get_table_names()))
        await conn.run_sync(metadata.create_all)
        return existing, await conn.scalar(select(schema_info.c.version))


async def _upgrade(db: AsyncEngine, version: int) -> int | None:
    """Apply the upgrade from `version` in one transaction (another replica may have done it first)."""
    async with db.begin() as conn:
        current = await conn.scalar(select(schema_info.c.version).with_for_update())
        if current == version:
            for statement in _UPGRADES[version]:
                await conn.execute(text(statement))
            await conn.execute(update(schema_info).values(version=version + 1))
            return version + 1
        return current
