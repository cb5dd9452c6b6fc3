"""The docs: the README stays short, every configuration field has a description for the generated reference, the
MkDocs site builds with strict link checking, its reference pages holding every config field and HTTP route and its
images resolving; what the pages name (images, code paths, the manifests' secrets, the app's layout) exists, no page
repeats a heading, and no table renders an escaped pipe."""

from __future__ import annotations

import glob
import importlib.util
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.docs_reference import config_sections, configuration_markdown, undocumented_fields

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
    for page in site.rglob("*.html"):
        html = page.read_text()
        for src in (m[2] for m in HTML_IMAGE.finditer(html)):
            assert _is_url(src) or (page.parent / src).resolve().is_file(), f"{page.relative_to(site)}: {src}"
        assert not [cell for cell in TABLE_CELL.findall(html) if "\\|" in cell], page.relative_to(site)


# --- what the pages name: images, code paths, headings, secrets; and the reference tables as MkDocs renders them ---

DOCS = ROOT / "docs"
PAGES = [*sorted(DOCS.rglob("*.md")), ROOT / "README.md"]
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
MARKDOWN_IMAGE = re.compile(r"!\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'][^)]*)?\)")
HTML_IMAGE = re.compile(r"<img\b[^>]*?\bsrc=([\"'])(.*?)\1", re.IGNORECASE)
CODE_PATH = re.compile(r"(?<![\w./-])((?:app|deployments|deploy|tests|bench|examples)/[\w./*-]*)")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$", re.MULTILINE)
TABLE_CELL = re.compile(r"<t[dh][^>]*>(.*?)</t[dh]>", re.DOTALL)


def _hooks() -> Any:
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _source(page: Path) -> str:
    """The page's markdown with its generated parts filled in, as the site builds it."""
    text = page.read_text()
    for placeholder, generate in _hooks().GENERATED.items():
        if placeholder in text:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                text = text.replace(placeholder, generate())
    return text


def _prose(text: str) -> str:
    """The page less its fenced code blocks."""
    return FENCE.sub("", text)


def _is_url(src: str) -> bool:
    return "://" in src or src.startswith(("data:", "mailto:", "#"))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_image_resolves_relative_to_its_page(page: Path) -> None:
    """As GitHub shows the page: markdown images and raw HTML `<img src>` alike, relative to the .md file (the site
    gets the same files: MkDocs rewrites markdown images, docs/hooks.py raw HTML ones)."""
    text = _prose(page.read_text())
    sources = [m[1] for m in MARKDOWN_IMAGE.finditer(text)] + [m[2] for m in HTML_IMAGE.finditer(text)]
    broken = [
        src
        for src in sources
        if not _is_url(src) and not (page.parent / src.split("#")[0].split("?")[0]).resolve().is_file()
    ]
    assert broken == [], f"{page.relative_to(ROOT)}: images that do not resolve relative to it: {broken}"


def test_raw_html_images_get_the_sites_paths() -> None:
    hooks = _hooks()
    html = '<img src="../screenshots/a.png" width="9"> <img src=\'https://x.org/b.png\'> <IMG alt="c" src="c.png">'
    assert hooks.site_image_paths(html, "guides/console.md", "guides/console/") == (
        '<img src="../../screenshots/a.png" width="9"> <img src=\'https://x.org/b.png\'> <IMG alt="c" src="../c.png">'
    )
    assert hooks.site_image_paths('<img src="screenshots/a.png">', "index.md", "") == '<img src="screenshots/a.png">'


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_code_path_a_page_names_exists(page: Path) -> None:
    """`app/...`, `deployments/...`, `deploy/...`, `tests/...`, `bench/...`, `examples/...`: a file or folder, a glob
    that matches one, or a module's attribute (`deployments/serve_env.CLUSTER`). Benchmark outputs are exempt."""
    missing = []
    for match in CODE_PATH.finditer(page.read_text()):
        path = match[1].rstrip(".,:;")
        if path.startswith("bench/results/"):  # where the commands the docs show write their results
            continue
        module, _, attribute = path.rpartition(".")
        if glob.glob(str(ROOT / path)) or (attribute.isidentifier() and (ROOT / f"{module}.py").is_file()):
            continue
        missing.append(path)
    assert missing == [], f"{page.relative_to(ROOT)} names paths that do not exist: {sorted(set(missing))}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_repeats_a_heading(page: Path) -> None:
    headings = [m[2] for m in HEADING.finditer(_prose(_source(page)))]
    repeated = sorted({h for h in headings if headings.count(h) > 1})
    assert repeated == [], f"{page.relative_to(ROOT)} has these headings more than once: {repeated}"


def _markdown() -> Any:
    """Python-Markdown with the site's extensions (mkdocs.yml), as MkDocs renders a page."""
    import markdown

    extensions, configs = [], {}
    for entry in yaml.safe_load((ROOT / "mkdocs.yml").read_text())["markdown_extensions"]:
        name, config = next(iter(entry.items())) if isinstance(entry, dict) else (entry, None)
        extensions.append(name)
        if config:
            configs[name] = config
    return markdown.Markdown(extensions=extensions, extension_configs=configs)


@pytest.mark.parametrize("page", sorted(DOCS.rglob("*.md")), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_table_cell_shows_an_escaped_pipe(page: Path) -> None:
    """In a table, `\\|` is a pipe outside a code span; inside one the backslash shows (`str \\| None`)."""
    html = _markdown().convert(_source(page))
    cells = [cell for cell in TABLE_CELL.findall(html) if "\\|" in cell]
    assert cells == [], f"{page.relative_to(ROOT)}: table cells that render a backslash before a pipe: {cells[:3]}"


def test_the_configuration_reference_writes_union_types_plainly() -> None:
    html = _markdown().convert(configuration_markdown())
    assert "<code>str | None</code>" in html and "\\|" not in html


def _secret_refs(node: Any) -> set[tuple[str, str | None]]:
    """(secret, key) of every secretKeyRef in a manifest, and (secret, None) of every secret volume or envFrom."""
    found: set[tuple[str, str | None]] = set()
    if isinstance(node, dict):
        if isinstance(ref := node.get("secretKeyRef"), dict):
            found.add((ref["name"], ref.get("key")))
        if isinstance(ref := node.get("secretRef"), dict):
            found.add((ref["name"], None))
        if isinstance(name := node.get("secretName"), str):
            found.add((name, None))
        for value in node.values():
            found |= _secret_refs(value)
    elif isinstance(node, list):
        for value in node:
            found |= _secret_refs(value)
    return found


def _manifests() -> list[Path]:
    return sorted(p for p in (ROOT / "deploy").rglob("*.yaml") if not p.name.endswith(".template.yaml"))


def test_the_cluster_walkthrough_names_every_secret_and_the_redis_the_manifests_need() -> None:
    """A secret the manifest reads and the walkthrough never creates leaves Pods waiting on it."""
    walkthrough = (DOCS / "guides" / "clusters-and-gpus.md").read_text()
    refs = {ref for path in _manifests() for doc in yaml.safe_load_all(path.read_text()) for ref in _secret_refs(doc)}
    assert ("tinker-serve-redis", "password") in refs
    for name, key in sorted(refs, key=str):
        assert f"`{name}`" in walkthrough, f"the walkthrough never names the secret {name}"
        assert key is None or f"`{key}`" in walkthrough, f"the walkthrough never names {name}'s key {key}"
    cluster = yaml.safe_load((ROOT / "deploy" / "kuberay" / "rayservice.yaml").read_text())["spec"]["rayClusterConfig"]
    assert f"`{cluster['gcsFaultToleranceOptions']['redisAddress']}`" in walkthrough


def _entry(block: str, name: str, following: str) -> str:
    """The text of the layout block's `name` entry, up to the `following` one."""
    start = block.index(f"\n{name} ")
    return block[start : block.index(f"\n{following} ", start)]


def test_the_architecture_layout_is_the_code() -> None:
    """Every package and module of app/ (and module of deployments/) the layout lists exists, and it lists them all."""
    layout = (DOCS / "architecture.md").read_text().split("## Layout\n", 1)[1].split("```")[1]
    app = _entry(layout, "app/", "deployments/")
    deployments = _entry(layout, "deployments/", "deploy/")
    packages = {p.name for p in (ROOT / "app").iterdir() if p.is_dir() and any(p.glob("*.py"))}
    assert set(re.findall(r"\b(\w+)/", app)) - {"app"} == packages
    assert set(re.findall(r"\b(\w+)\.py\b", app)) == {p.stem for p in (ROOT / "app").glob("*.py")} - {"__init__"}
    assert set(re.findall(r"\b(\w+)\.py\b", deployments)) == {p.stem for p in (ROOT / "deployments").glob("*.py")} - {
        "__init__"
    }
