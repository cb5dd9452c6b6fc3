"""Futures' subject_id: the column a future's model, sampling session or custom loss id is in was named model_id

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-27 01:00:00.000000
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE futures RENAME COLUMN model_id TO subject_id")  # SQLite >= 3.25 and PostgreSQL
    op.drop_index("ux_futures_model_seq", table_name="futures")
    op.drop_index("ix_futures_state_model", table_name="futures")
    op.create_index("ux_futures_subject_seq", "futures", ["subject_id", "seq_id"], unique=True)
    op.create_index("ix_futures_state_subject", "futures", ["state", "subject_id"])


def downgrade() -> None:
    raise NotImplementedError("tinker-serve upgrades in place and does not downgrade: restore a backup instead")
