"""Durable state over SQLAlchemy async: futures, sessions and training runs (SQLite or Postgres)."""
