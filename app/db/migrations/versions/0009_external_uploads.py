"""External uploads: adapters trained elsewhere being uploaded (external_weights_upload_start / _finish)

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-29 02:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "external_uploads",
        sa.Column("upload_id", sa.String(length=64), primary_key=True),
        sa.Column("owner", sa.String(length=64), nullable=False),
        sa.Column("base_model", sa.String(length=200), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("project_id", sa.String(length=200), nullable=True),
        sa.Column("files", sa.JSON(), nullable=False),
        sa.Column("reserved_bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.Column("tinker_path", sa.String(length=400), nullable=True),
    )
    op.create_index("ix_external_uploads_owner", "external_uploads", ["owner"])
    op.create_index("ix_external_uploads_expires_at", "external_uploads", ["expires_at"])


def downgrade() -> None:
    raise NotImplementedError("tinker-serve upgrades in place and does not downgrade: restore a backup instead")
