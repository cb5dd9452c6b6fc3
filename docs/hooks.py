"""MkDocs hook: the reference pages' generated parts (app/docs_reference.py) fill their placeholders at build time."""

from __future__ import annotations

import warnings
from typing import Any

from app import docs_reference

GENERATED = {
    "<!-- generated: configuration -->": docs_reference.configuration_markdown,
    "<!-- generated: http-api -->": docs_reference.http_api_markdown,
}


def on_page_markdown(markdown: str, **_: Any) -> str:
    for placeholder, generate in GENERATED.items():
        if placeholder in markdown:
            with warnings.catch_warnings():  # FastAPI's notes on the schema are not the docs' concern
                warnings.simplefilter("ignore")
                markdown = markdown.replace(placeholder, generate())
    return markdown
