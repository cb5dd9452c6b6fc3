"""Alembic's migrations of the metadata database (`versions/`), applied by `app.db.migrate` at every start."""
