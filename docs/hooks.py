"""MkDocs hooks: the reference pages' generated parts (app/docs_reference.py) fill their placeholders at build time, and
images written as raw HTML get the paths the site needs."""

from __future__ import annotations

import posixpath
import re
import warnings
from typing import Any

from mkdocs.structure.pages import Page
from mkdocs.utils import get_relative_url

from app import docs_reference

GENERATED = {
    "<!-- generated: configuration -->": docs_reference.configuration_markdown,
    "<!-- generated: http-api -->": docs_reference.http_api_markdown,
}
RAW_IMAGE = re.compile(r"""(<img\b[^>]*?\bsrc=)(["'])(.*?)\2""", re.IGNORECASE)


def on_page_markdown(markdown: str, page: Page, **_: Any) -> str:
    for placeholder, generate in GENERATED.items():
        if placeholder in markdown:
            with warnings.catch_warnings():  # FastAPI's notes on the schema are not the docs' concern
                warnings.simplefilter("ignore")
                markdown = markdown.replace(placeholder, generate())
    return site_image_paths(markdown, page.file.src_uri, page.url)


def site_image_paths(markdown: str, src_uri: str, url: str) -> str:
    """`<img src>` in raw HTML is written relative to the page's .md file, which is what GitHub resolves; the site
    serves the page at `url` (`guides/console/` for guides/console.md), so the path is rewritten relative to that.
    MkDocs does this for markdown images itself, never inside raw HTML. Absolute paths and URLs stay as they are."""

    def site_path(match: re.Match[str]) -> str:
        prefix, quote, src = match.groups()
        if not src or src.startswith(("/", "#", "data:")) or "://" in src:
            return match[0]
        target = posixpath.normpath(posixpath.join(posixpath.dirname(src_uri), src))
        return f"{prefix}{quote}{get_relative_url(target, url)}{quote}"

    return RAW_IMAGE.sub(site_path, markdown)
