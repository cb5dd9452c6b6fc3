"""Run history: each model's training steps as they finished (a run's curves, read through REST)

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24 13:40:30.083582
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_history",
        sa.Column("model_id", sa.String(length=200), nullable=False),
        sa.Column("seq_id", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("tokens", sa.BigInteger(), nullable=False),
        sa.Column("learning_rate", sa.Float(), nullable=True),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("model_id", "seq_id"),
    )


def downgrade() -> None:
    raise NotImplementedError("tinker-serve upgrades in place and does not downgrade: restore a backup instead")
