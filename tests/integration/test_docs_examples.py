"""The README's and the quickstart's Python code blocks, run as written (only the server's address changes) against
the test server, each in a fresh interpreter: a user who copies them gets code that works."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = ("README.md", "docs/quickstart.md")
DOCUMENTED_URL = "http://127.0.0.1:8000"  # what the blocks connect to: `make serve`'s address


def _python_blocks(page: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / page).read_text(), flags=re.DOTALL)


@pytest.mark.parametrize(
    "page, index", [(page, i) for page in PAGES for i in range(len(_python_blocks(page)))], ids=str
)
def test_a_documented_example_runs(base_url: str, page: str, index: int) -> None:
    code = _python_blocks(page)[index]
    assert DOCUMENTED_URL in code  # it talks to the server (and so to the test server below)
    run = subprocess.run(
        [sys.executable, "-c", code.replace(DOCUMENTED_URL, base_url)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, f"{page} block {index}:\n{run.stderr[-3000:]}"
