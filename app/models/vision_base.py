"""A base model's image-pad token, where it is served as vision-language: its config names the token and its image
processor's files are beside it (app.images.tokens reads them). A VLM checkpoint without them is served as text."""

from __future__ import annotations

import json
from pathlib import Path

from app.images.tokens import PROCESSOR_FILE


def image_token_id(model_dir: Path) -> int | None:
    """The token each of an image's vision tokens stands as in a prompt on the base at `model_dir`; None when the
    base is served as text."""
    config = model_dir / "config.json"
    if not (model_dir / PROCESSOR_FILE).is_file() or not config.is_file():
        return None
    token = json.loads(config.read_text()).get("image_token_id")
    return token if isinstance(token, int) and not isinstance(token, bool) else None
