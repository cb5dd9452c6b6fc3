"""The cluster artifacts under deploy/: they parse, their embedded application config validates against the
one config model, they agree with each other, secrets come only from Kubernetes secrets or the environment,
and nothing secret is written in them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from app.config import API_KEYS_ENV, ServerConfig
from tests.conftest import ROOT

DEPLOY = ROOT / "deploy"
GPU_PROFILE = DEPLOY / "serve_config.gpu.yaml"
RAYSERVICE = DEPLOY / "kuberay" / "rayservice.yaml"
ANYSCALE = DEPLOY / "anyscale" / "service.yaml"
SECRET_ENV = {"TINKER_SERVE_DATABASE_URL", "TINKER_SERVE_STORAGE_URI", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}


def _applications() -> dict[str, list[dict]]:
    rayservice = yaml.safe_load(RAYSERVICE.read_text())
    return {"gpu profile": yaml.safe_load(GPU_PROFILE.read_text())["applications"],
            "rayservice": yaml.safe_load(rayservice["spec"]["serveConfigV2"])["applications"],
            "anyscale": yaml.safe_load(ANYSCALE.read_text())["applications"],
            "embedded default": yaml.safe_load((ROOT / "serve_config.yaml").read_text())["applications"]}


@pytest.mark.parametrize("source", ["gpu profile", "rayservice", "anyscale", "embedded default"])
def test_embedded_app_config_validates(source: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (app,) = _applications()[source]
    assert app["import_path"] == "deployments.builder:build_app"
    args = app["args"]
    if args["auth"].get("api_keys_file"):  # a mounted secret on the cluster; a stand-in file here
        keys = tmp_path / "keys"
        keys.write_text("tml-from-the-secret\n")
        args["auth"]["api_keys_file"] = str(keys)
    monkeypatch.setenv(API_KEYS_ENV, "tml-from-the-environment")
    config = ServerConfig.model_validate(args)
    if source != "embedded default":
        (base,) = config.base_models
        assert base.trainer.use_gpu and base.sampler.num_gpus >= 1 and config.auth.mode == "api_keys"
        assert config.database_url is None and config.storage_uri is None  # from the environment, never inline


def test_cluster_manifests_carry_the_gpu_profile() -> None:
    apps = _applications()
    profile = apps["gpu profile"][0]["args"]
    for source in ("rayservice", "anyscale"):
        args = apps[source][0]["args"]
        assert args["base_models"] == profile["base_models"] and args["limits"] == profile["limits"], source


@pytest.mark.parametrize("source", ["gpu profile", "rayservice", "anyscale"])
def test_cluster_logs_are_json(source: str) -> None:
    from ray.serve.schema import EncodingType, LoggingConfig

    (app,) = _applications()[source]
    assert LoggingConfig.model_validate(app["logging_config"]).encoding == EncodingType.JSON


def test_rayservice_takes_secrets_from_kubernetes_secrets() -> None:
    spec = yaml.safe_load(RAYSERVICE.read_text())["spec"]
    assert yaml.safe_load(RAYSERVICE.read_text())["kind"] == "RayService"
    cluster = spec["rayClusterConfig"]
    pods = [cluster["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"] for g in cluster["workerGroupSpecs"]]
    assert any("nvidia.com/gpu" in c["resources"]["limits"] for g in pods[1:] for c in g["containers"])
    for pod in pods:
        for container in pod["containers"]:
            env = {e["name"]: e for e in container["env"]}
            assert env.keys() >= SECRET_ENV
            for name in SECRET_ENV:
                assert "value" not in env[name] and "secretKeyRef" in env[name]["valueFrom"], name
            assert any(m["mountPath"] == "/etc/tinker-serve/api-keys" for m in container["volumeMounts"])
        assert any(v.get("secret", {}).get("secretName") == "tinker-serve-api-keys" for v in pod["volumes"])


_SECRET_PATTERNS = [
    re.compile(r"tml-[A-Za-z0-9]{8,}"),  # a Tinker API key
    re.compile(r"AKIA[0-9A-Z]{16}"),  # an AWS access key id
    re.compile(r"postgres(?:ql)?(?:\+\w+)?://[^<\s'\"]+:[^<\s'\"]+@"),  # a database URL with a password
    re.compile(r"(?i)(password|secret_access_key|api_key)\s*[:=]\s*['\"]?[A-Za-z0-9/+]{8,}"),
]


@pytest.mark.parametrize("path", sorted(p for p in DEPLOY.rglob("*") if p.is_file()), ids=lambda p: p.name)
def test_no_secrets_are_written_in_deploy_files(path: Path) -> None:
    text = path.read_text()
    for pattern in _SECRET_PATTERNS:
        assert not pattern.search(text), f"{path.name} holds something secret-looking: {pattern.pattern}"


def test_a_wrong_value_fails_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(API_KEYS_ENV, "tml-from-the-environment")
    args = yaml.safe_load(GPU_PROFILE.read_text())["applications"][0]["args"]
    args["auth"]["api_keys_file"] = None
    args["base_models"][0]["sampler"]["max_loras"] = 0
    args["limits"]["max_lora_rank"] = "big"
    with pytest.raises(ValidationError) as info:
        ServerConfig.model_validate(args)
    message = str(info.value)
    assert "base_models.0.sampler.max_loras" in message and "limits.max_lora_rank" in message
