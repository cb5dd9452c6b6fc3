"""Models the server can run without a model hub: the offline-built embedded presets."""

from __future__ import annotations

from typing import Any

__all__ = ["PRESETS", "build_embedded_model"]


def __getattr__(name: str) -> Any:
    """Re-export lazily, so `python -m app.models.embedded` does not import the module twice."""
    if name in __all__:
        from app.models import embedded

        return getattr(embedded, name)
    raise AttributeError(name)
