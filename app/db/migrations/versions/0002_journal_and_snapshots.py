"""Journal and snapshots: what rebuilds a model after a worker, the trainer or the whole app restarts

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-24 12:37:43.298721
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "journal",
        sa.Column("model_id", sa.String(length=200), nullable=False),
        sa.Column("seq_id", sa.BigInteger(), nullable=False),
        sa.Column("request_id", sa.String(length=64), nullable=False),
        sa.Column("op", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("model_id", "seq_id"),
    )
    op.create_table(
        "snapshots",
        sa.Column("model_id", sa.String(length=200), nullable=False),
        sa.Column("seq_id", sa.BigInteger(), nullable=False),
        sa.Column("location", sa.String(length=600), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("model_id", "seq_id"),
    )


def downgrade() -> None:
    raise NotImplementedError("tinker-serve upgrades in place and does not downgrade: restore a backup instead")
