"""Journal pass layout: the shape of the mixed pass a forward_backward ran in (several models' operations as one pass),
what replays it bit for bit when its model is rebuilt

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-27 10:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("journal", sa.Column("layout", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    raise NotImplementedError("tinker-serve upgrades in place and does not downgrade: restore a backup instead")
