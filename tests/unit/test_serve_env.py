"""Serve's request-path settings are the same wherever the project starts Ray (deployments/serve_env.py): `make serve`
takes them from the module, the cluster manifests set the cluster's, and the app refuses to build without them."""

from __future__ import annotations

import logging
import re
import subprocess
import sys

import pytest
import yaml

from deployments import serve_env
from tests.conftest import ROOT


def test_make_serve_takes_the_single_node_settings_from_the_module() -> None:
    assert 'eval "$$($(PY) -m deployments.serve_env --port 8000)"' in (ROOT / "Makefile").read_text()
    printed = subprocess.run(
        [sys.executable, "-m", "deployments.serve_env", "--port", "8000"], capture_output=True, text=True, check=True
    ).stdout
    assert dict(re.findall(r"^export (\w+)=(\S+)$", printed, re.M)) == serve_env.single_node(8000)
    assert serve_env.direct_port(serve_env.single_node(8000)) == 8000


def test_serve_config_puts_serve_s_proxy_beside_the_api_port() -> None:
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    assert config["http_options"] == {"host": "127.0.0.1", "port": 8001}


def test_cluster_manifests_set_the_cluster_settings() -> None:
    containerfile = (ROOT / "deploy" / "anyscale" / "Containerfile").read_text()
    assert dict(re.findall(r"(RAY_SERVE_\w+)=(\S+)", containerfile)) == serve_env.CLUSTER
    kuberay = (ROOT / "deploy" / "kuberay" / "rayservice.yaml").read_text()
    assert dict(re.findall(r'\{name: (RAY_SERVE_\w+), value: "(\S+)"\}', kuberay)) == serve_env.CLUSTER


@pytest.mark.parametrize(
    ("environ", "wrong"),
    [
        ({}, "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD=0"),
        ({**serve_env.REQUEST_PATH}, "RAY_SERVE_ENABLE_DIRECT_INGRESS=1 with"),
        ({**serve_env.REQUEST_PATH, "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1"}, "RAY_SERVE_ENABLE_DIRECT_INGRESS=1 with"),
        ({**serve_env.single_node(8000), "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": "8010"}, "<port + 1>"),
        ({**serve_env.single_node(8000), "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "1"}, "SEPARATE_LOOP=0"),
    ],
)
def test_missing_settings_name_what_to_set(environ: dict[str, str], wrong: str) -> None:
    message = serve_env.missing(environ)
    assert message is not None and wrong in message and "make serve" in message


@pytest.mark.parametrize("environ", [serve_env.single_node(8000), serve_env.CLUSTER])
def test_either_ingress_is_enough(environ: dict[str, str]) -> None:
    assert serve_env.missing(environ) is None


def test_the_app_builds_without_them_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bare `serve run`: the app goes on to build (served through Serve's proxy), with one warning naming the
    faster start."""
    import deployments.builder

    class BuiltPastTheCheck(Exception):
        pass

    def model_limits(config: object) -> None:
        raise BuiltPastTheCheck

    class Kept(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            warnings.append(record.getMessage())

    warnings: list[str] = []
    monkeypatch.delenv("RAY_SERVE_ENABLE_DIRECT_INGRESS")
    monkeypatch.setattr(deployments.builder, "route_app_logs", lambda: None)
    monkeypatch.setattr(deployments.builder, "_model_limits", model_limits)
    tiny = {"name": "tiny", "path": "models/tiny", "embedded_preset": "tiny"}
    kept = Kept(logging.WARNING)
    deployments.builder.logger.addHandler(kept)  # its own: the app's loggers may propagate no further
    try:
        with pytest.raises(BuiltPastTheCheck):
            deployments.builder.build_app({"auth": {"mode": "any_tml_key_on_loopback"}, "base_models": [tiny]})
    finally:
        deployments.builder.logger.removeHandler(kept)
    (warning,) = warnings
    assert "Serve's Python proxy" in warning and "make serve" in warning
