"""Checkpoint search: an index walking checkpoints newest first then by path (search_checkpoints' order and cursor),
and one finding a base model's runs (its base_models filter)

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-29 02:30:00.000000
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_checkpoints_created_path", "checkpoints", ["created_at", "model_id", "kind", "name"])
    op.create_index("ix_training_runs_base_model", "training_runs", ["base_model"])


def downgrade() -> None:
    raise NotImplementedError("tinker-serve upgrades in place and does not downgrade: restore a backup instead")
