"""Serve's request-path settings are the same wherever the project starts Ray: deployments/serve_env.py (tests,
benchmarks), the Makefile (`make serve`) and the cluster image's Containerfile."""

from __future__ import annotations

import re

from deployments.serve_env import SERVE_ENV
from tests.conftest import ROOT


def test_makefile_exports_the_same_serve_settings() -> None:
    exported = dict(re.findall(r"^export (RAY_SERVE_\w+) \?= (\S+)$", (ROOT / "Makefile").read_text(), re.M))
    assert exported == SERVE_ENV


def test_cluster_image_sets_the_same_serve_settings() -> None:
    text = (ROOT / "deploy" / "anyscale" / "Containerfile").read_text()
    assert dict(re.findall(r"(RAY_SERVE_\w+)=(\S+)", text)) == SERVE_ENV
