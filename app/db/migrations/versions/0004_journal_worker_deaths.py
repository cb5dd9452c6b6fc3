"""Journal worker deaths: how often the training workers died while each operation ran (one that keeps killing them
fails instead of being rerun forever)

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-25 09:12:05.417220
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("journal", sa.Column("worker_deaths", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    raise NotImplementedError("tinker-serve upgrades in place and does not downgrade: restore a backup instead")
