"""Alembic's entry point. The server passes the connection to migrate (app.db.migrate); a developer making a new
revision runs `alembic -c app/db/migrations/alembic.ini -x url=sqlite:///state/metadata.db revision --autogenerate
-m "what changes"`, which compares that database (migrated to head first) with app.db.schema's tables."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from app.db.schema import metadata

config = context.config
connection = config.attributes.get("connection")
if connection is not None:
    context.configure(connection=connection, target_metadata=metadata)
    with context.begin_transaction():
        context.run_migrations()
else:
    url = context.get_x_argument(as_dictionary=True).get("url")
    if not url:
        raise SystemExit("name the database to compare with: alembic ... -x url=sqlite:///path/to/metadata.db")
    with create_engine(url).begin() as conn:
        context.configure(connection=conn, target_metadata=metadata)
        with context.begin_transaction():
            context.run_migrations()
