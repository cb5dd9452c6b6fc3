"""The docs: the README stays short, every configuration field has a description for the generated reference, and the
MkDocs site builds with strict link checking, its reference pages holding every config field and HTTP route."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from app.docs_reference import config_sections, undocumented_fields

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 200


def test_the_readme_reads_in_two_minutes() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= README_MAX_LINES


def test_every_configuration_field_has_a_description() -> None:
    assert undocumented_fields() == []


def test_the_site_builds_strict_with_every_field_and_route(tmp_path: Path) -> None:
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    configuration = (site / "reference" / "configuration" / "index.html").read_text()
    for path, model in config_sections():
        for name in model.model_fields:
            assert f"<code>{name}</code>" in configuration, f"{path}.{name}"
    http_api = (site / "reference" / "http-api" / "index.html").read_text()
    for route in ("/api/v1/forward_backward", "/api/v1/asample", "/v1/chat/completions", "/ready"):
        assert f"<code>{route}</code>" in http_api
