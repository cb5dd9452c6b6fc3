"""Errors of the metadata database itself."""

from __future__ import annotations


class SchemaMismatch(RuntimeError):
    """The database was made by a tinker-serve version this one cannot open."""
