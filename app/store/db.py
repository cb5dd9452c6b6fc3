"""Tables and engine set-up shared by the future store and the metadata store."""

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
    event,
)
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

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
    Column("last_seq_id", Integer, nullable=False, default=0),
    Column("unloaded", Integer, nullable=False, default=0),
)

sampling_sessions = Table(
    "sampling_sessions",
    metadata,
    Column("sampling_session_id", String(200), primary_key=True),
    Column("session_id", String(64), nullable=False),
    Column("base_model", String(200), nullable=False),
    Column("model_path", String(400)),  # tinker:// path; null for the base model
    Column("adapter_dir", String(1000)),  # where samplers load the adapter; null for the base model
    Column("ephemeral", Integer, nullable=False, default=0),
    Column("created_at", Float, nullable=False),
    Column("last_used_at", Float, nullable=False),
)


def make_engine(url: str) -> AsyncEngine:
    """An async engine; SQLite files get WAL and a busy timeout so several processes can share them."""
    if url.startswith("sqlite"):
        db_path = url.split(":///", 1)[1]
        Path(db_path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_async_engine(url, connect_args={"timeout": 30})

        @event.listens_for(engine.sync_engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record) -> None:  # noqa: ANN001 - DBAPI types
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return engine
    return create_async_engine(url, pool_pre_ping=True)


async def create_tables(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all)
