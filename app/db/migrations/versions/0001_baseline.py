"""The schema as of tinker-serve's last version before Alembic (schema_info version 5), and the adoption of databases
made before Alembic.

A fresh database gets every table. A database made before Alembic records its version in `schema_info` (none at
all: version 1, refused): versions 2-4 get the in-place statements older releases applied, and only the tables
they lack are created. Afterwards `schema_info` says 6, which every release before Alembic refuses to open ("use the
tinker-serve version that made it") instead of writing to a schema it does not know.

Revision ID: 0001
Revises:
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.engine import Connection

from app.db.migrate import SchemaMismatch

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

MANAGED_BY_ALEMBIC = 6  # schema_info's version from here on; releases before Alembic needed <= 5
_LEGACY_UPGRADES: dict[int, tuple[str, ...]] = {  # schema_info version v -> the statements that made it v + 1
    2: ("ALTER TABLE training_runs DROP COLUMN last_seq_id",),
    3: (),  # stability_records is a new table
    4: (
        "ALTER TABLE sessions ADD COLUMN owner VARCHAR(64)",
        "CREATE INDEX ix_sessions_owner ON sessions (owner)",
        "CREATE INDEX ix_futures_state_model ON futures (state, model_id)",
    ),
}


def upgrade() -> None:
    bind = op.get_bind()
    existing = set(sa.inspect(bind).get_table_names())
    version = _legacy_version(bind, existing)
    if version is not None:
        if version not in (*_LEGACY_UPGRADES, 5):
            raise SchemaMismatch(
                f"this database has schema version {version}, which no tinker-serve release upgrades; start with a "
                "fresh state_dir (or database_url), or use the tinker-serve version that made it"
            )
        for v in range(version, 5):
            for statement in _LEGACY_UPGRADES[v]:
                op.execute(statement)
    if "api_keys" not in existing:
        op.create_table(
            "api_keys",
            sa.Column("key_id", sa.Integer(), autoincrement=True, nullable=False),
            sa.Column("key_hash", sa.String(length=64), nullable=False),
            sa.Column("owner", sa.String(length=64), nullable=False),
            sa.Column("name", sa.String(length=200), nullable=False),
            sa.Column("hint", sa.String(length=16), nullable=False),
            sa.Column("origin", sa.String(length=16), nullable=False),
            sa.Column("created_at", sa.Float(), nullable=False),
            sa.Column("last_used_at", sa.Float(), nullable=True),
            sa.Column("expires_at", sa.Float(), nullable=True),
            sa.Column("revoked_at", sa.Float(), nullable=True),
            sa.PrimaryKeyConstraint("key_id"),
            sa.UniqueConstraint("key_hash"),
        )
        op.create_index("ix_api_keys_owner", "api_keys", ["owner"], unique=False)
    if "audit_events" not in existing:
        op.create_table(
            "audit_events",
            sa.Column("event_id", sa.Integer(), autoincrement=True, nullable=False),
            sa.Column("at", sa.Float(), nullable=False),
            sa.Column("event", sa.String(length=64), nullable=False),
            sa.Column("actor", sa.String(length=64), nullable=False),
            sa.Column("subject_owner", sa.String(length=64), nullable=True),
            sa.Column("details", sa.JSON(), nullable=False),
            sa.PrimaryKeyConstraint("event_id"),
        )
        op.create_index("ix_audit_events_actor", "audit_events", ["actor"], unique=False)
        op.create_index("ix_audit_events_at", "audit_events", ["at"], unique=False)
        op.create_index("ix_audit_events_subject_owner", "audit_events", ["subject_owner"], unique=False)
    if "checkpoints" not in existing:
        op.create_table(
            "checkpoints",
            sa.Column("model_id", sa.String(length=200), nullable=False),
            sa.Column("kind", sa.String(length=32), nullable=False),
            sa.Column("name", sa.String(length=128), nullable=False),
            sa.Column("location", sa.String(length=600), nullable=False),
            sa.Column("size_bytes", sa.BigInteger(), nullable=False),
            sa.Column("created_at", sa.Float(), nullable=False),
            sa.Column("expires_at", sa.Float(), nullable=True),
            sa.Column("public", sa.Integer(), nullable=False),
            sa.Column("user_metadata", sa.JSON(), nullable=True),
            sa.PrimaryKeyConstraint("model_id", "kind", "name"),
        )
        op.create_index("ix_checkpoints_created_at", "checkpoints", ["created_at"], unique=False)
        op.create_index("ix_checkpoints_expires_at", "checkpoints", ["expires_at"], unique=False)
    if "copy_requests" not in existing:
        op.create_table(
            "copy_requests",
            sa.Column("idempotency_key", sa.String(length=200), nullable=False),
            sa.Column("tinker_path", sa.String(length=400), nullable=False),
            sa.Column("created_at", sa.Float(), nullable=False),
            sa.PrimaryKeyConstraint("idempotency_key"),
        )
    if "custom_losses" not in existing:
        op.create_table(
            "custom_losses",
            sa.Column("loss_id", sa.String(length=200), nullable=False),
            sa.Column("session_id", sa.String(length=64), nullable=False),
            sa.Column("name", sa.String(length=200), nullable=False),
            sa.Column("program", sa.Text(), nullable=False),
            sa.Column("created_at", sa.Float(), nullable=False),
            sa.PrimaryKeyConstraint("loss_id"),
        )
        op.create_index("ix_custom_losses_session_id", "custom_losses", ["session_id"], unique=False)
    if "futures" not in existing:
        op.create_table(
            "futures",
            sa.Column("request_id", sa.String(length=64), nullable=False),
            sa.Column("kind", sa.String(length=32), nullable=False),
            sa.Column("model_id", sa.String(length=200), nullable=True),
            sa.Column("seq_id", sa.BigInteger(), nullable=True),
            sa.Column("state", sa.String(length=16), nullable=False),
            sa.Column("content_type", sa.String(length=64), nullable=True),
            sa.Column("payload", sa.LargeBinary(), nullable=True),
            sa.Column("error", sa.JSON(), nullable=True),
            sa.Column("created_at", sa.Float(), nullable=False),
            sa.Column("completed_at", sa.Float(), nullable=True),
            sa.PrimaryKeyConstraint("request_id"),
        )
        op.create_index("ix_futures_state_model", "futures", ["state", "model_id"], unique=False)
        op.create_index("ux_futures_model_seq", "futures", ["model_id", "seq_id"], unique=True)
    if "sample_completions" not in existing:
        op.create_table(
            "sample_completions",
            sa.Column("sampling_session_id", sa.String(length=200), nullable=False),
            sa.Column("clone_id", sa.BigInteger(), nullable=False),
            sa.Column("cursor", sa.BigInteger(), nullable=False),
            sa.Column("request_id", sa.String(length=64), nullable=False),
            sa.Column("state", sa.String(length=16), nullable=False),
            sa.Column("payload_size", sa.BigInteger(), nullable=True),
            sa.PrimaryKeyConstraint("sampling_session_id", "clone_id", "cursor"),
        )
    if "sampling_clients" not in existing:
        op.create_table(
            "sampling_clients",
            sa.Column("sampling_session_id", sa.String(length=200), nullable=False),
            sa.Column("client_counter", sa.BigInteger(), nullable=False),
            sa.PrimaryKeyConstraint("sampling_session_id", "client_counter"),
        )
    if "sampling_sessions" not in existing:
        op.create_table(
            "sampling_sessions",
            sa.Column("sampling_session_id", sa.String(length=200), nullable=False),
            sa.Column("session_id", sa.String(length=64), nullable=False),
            sa.Column("base_model", sa.String(length=200), nullable=False),
            sa.Column("model_path", sa.String(length=400), nullable=True),
            sa.Column("adapter_location", sa.String(length=1000), nullable=True),
            sa.Column("ephemeral", sa.Integer(), nullable=False),
            sa.Column("created_at", sa.Float(), nullable=False),
            sa.Column("last_used_at", sa.Float(), nullable=False),
            sa.PrimaryKeyConstraint("sampling_session_id"),
        )
    if "session_labels" not in existing:
        op.create_table(
            "session_labels",
            sa.Column("session_id", sa.String(length=64), nullable=False),
            sa.Column("project_id", sa.String(length=200), nullable=True),
            sa.Column("display_name", sa.String(length=400), nullable=True),
            sa.PrimaryKeyConstraint("session_id"),
        )
        op.create_index("ix_session_labels_project_id", "session_labels", ["project_id"], unique=False)
    if "session_requests" not in existing:
        op.create_table(
            "session_requests",
            sa.Column("request_id", sa.String(length=64), nullable=False),
            sa.Column("session_id", sa.String(length=64), nullable=False),
            sa.Column("created_at", sa.Float(), nullable=False),
            sa.PrimaryKeyConstraint("request_id"),
        )
        op.create_index(
            "ix_session_requests_session_created", "session_requests", ["session_id", "created_at"], unique=False
        )
    if "sessions" not in existing:
        op.create_table(
            "sessions",
            sa.Column("session_id", sa.String(length=64), nullable=False),
            sa.Column("created_at", sa.Float(), nullable=False),
            sa.Column("last_heartbeat", sa.Float(), nullable=False),
            sa.Column("finished_reason", sa.String(length=32), nullable=True),
            sa.Column("sdk_version", sa.String(length=32), nullable=True),
            sa.Column("tags", sa.JSON(), nullable=True),
            sa.Column("user_metadata", sa.JSON(), nullable=True),
            sa.Column("owner", sa.String(length=64), nullable=True),
            sa.PrimaryKeyConstraint("session_id"),
        )
        op.create_index("ix_sessions_owner", "sessions", ["owner"], unique=False)
    if "settings" not in existing:
        op.create_table(
            "settings",
            sa.Column("key", sa.String(length=64), nullable=False),
            sa.Column("value", sa.String(length=1000), nullable=False),
            sa.PrimaryKeyConstraint("key"),
        )
    if "stability_records" not in existing:
        op.create_table(
            "stability_records",
            sa.Column("sequence_id", sa.String(length=200), nullable=False),
            sa.Column("session_id", sa.String(length=64), nullable=False),
            sa.Column("adapter_location", sa.String(length=1000), nullable=True),
            sa.Column("prompt", sa.LargeBinary(), nullable=False),
            sa.Column("tokens", sa.LargeBinary(), nullable=False),
            sa.Column("logprobs", sa.LargeBinary(), nullable=False),
            sa.Column("created_at", sa.Float(), nullable=False),
            sa.Column("last_used_at", sa.Float(), nullable=False),
            sa.PrimaryKeyConstraint("sequence_id"),
        )
        op.create_index("ix_stability_records_last_used_at", "stability_records", ["last_used_at"], unique=False)
        op.create_index("ix_stability_records_session_id", "stability_records", ["session_id"], unique=False)
    if "training_runs" not in existing:
        op.create_table(
            "training_runs",
            sa.Column("model_id", sa.String(length=200), nullable=False),
            sa.Column("session_id", sa.String(length=64), nullable=False),
            sa.Column("base_model", sa.String(length=200), nullable=False),
            sa.Column("lora_rank", sa.Integer(), nullable=False),
            sa.Column("role", sa.String(length=16), nullable=False),
            sa.Column("trainer", sa.String(length=220), nullable=False),
            sa.Column("lora_config", sa.JSON(), nullable=False),
            sa.Column("user_metadata", sa.JSON(), nullable=True),
            sa.Column("created_at", sa.Float(), nullable=False),
            sa.Column("unloaded", sa.Integer(), nullable=False),
            sa.PrimaryKeyConstraint("model_id"),
        )
        op.create_index("ix_training_runs_trainer", "training_runs", ["trainer"], unique=False)
    if "usage_hours" not in existing:
        op.create_table(
            "usage_hours",
            sa.Column("bucket_start", sa.Float(), nullable=False),
            sa.Column("session_id", sa.String(length=64), nullable=False),
            sa.Column("base_model", sa.String(length=200), nullable=False),
            sa.Column("kind", sa.String(length=32), nullable=False),
            sa.Column("token_count", sa.BigInteger(), nullable=False),
            sa.PrimaryKeyConstraint("bucket_start", "session_id", "base_model", "kind"),
        )
    if "users" not in existing:
        op.create_table(
            "users",
            sa.Column("name", sa.String(length=64), nullable=False),
            sa.Column("created_at", sa.Float(), nullable=False),
            sa.PrimaryKeyConstraint("name"),
        )
    if "schema_info" not in existing:
        op.create_table(
            "schema_info", sa.Column("version", sa.Integer(), nullable=False), sa.PrimaryKeyConstraint("version")
        )
    op.execute("DELETE FROM schema_info")
    op.execute(f"INSERT INTO schema_info (version) VALUES ({MANAGED_BY_ALEMBIC})")


def _legacy_version(bind: Connection, existing: set[str]) -> int | None:
    """The schema_info version of a database made before Alembic (1: made before versions were recorded); None for
    a fresh one."""
    if "schema_info" in existing:
        return bind.scalar(sa.text("SELECT version FROM schema_info"))
    return 1 if "futures" in existing else None


def downgrade() -> None:
    raise NotImplementedError("tinker-serve upgrades in place and does not downgrade: restore a backup instead")
