"""ServerConfig validation: model list, strictness, the sections and the fields that moved out of `limits`, a
description on every field, auth keys (read outside validation), path resolution, the shipped serve_config."""

from __future__ import annotations

import types
import typing
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel, ValidationError

from app.config import (
    API_KEYS_ENV,
    DATABASE_URL_ENV,
    MOVED_FROM_LIMITS,
    SECTIONS,
    STORAGE_URI_ENV,
    AuthConfig,
    EngineConfig,
    LimitsConfig,
    QuotasConfig,
    RetentionConfig,
    ServerConfig,
    TimeoutsConfig,
)
from app.config_sections import UserQuotas
from app.sampling.cpu_env import replica_env

ROOT = Path(__file__).resolve().parents[2]
LOOPBACK = {"mode": "any_tml_key_on_loopback"}
TINY = {"name": "tiny", "path": "models/tiny", "embedded_preset": "tiny"}
SHARED_GPU = {  # deploy/serve_config.one-gpu.yaml's split
    "trainer": {"num_workers": 1, "use_gpu": True, "gpus_per_worker": 0.5, "gpu_memory_fraction": 0.5},
    "sampler": {"num_gpus": 0.5, "gpu_memory_utilization": 0.4},
}


@pytest.fixture(autouse=True)
def _no_env_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(API_KEYS_ENV, raising=False)


def test_a_real_models_path_with_the_embedded_preset_line_left_in_serves_that_model() -> None:
    """The embedded config's `embedded_preset: tiny` kept while `path` names a real model must not build the tiny
    random model there and serve it under the real model's name: the path is served as given."""
    swapped = ServerConfig(base_models=[{**TINY, "path": "Qwen/Qwen3-0.6B"}], auth=LOOPBACK).resolved().base_models[0]
    assert not swapped.builds_embedded() and swapped.path == "Qwen/Qwen3-0.6B"  # a Hub id, not a local folder
    embedded = ServerConfig(base_models=[TINY], auth=LOOPBACK).resolved().base_models[0]
    assert embedded.builds_embedded() and embedded.path == str(Path("models/tiny").resolve())


def test_minimal_config_defaults() -> None:
    cfg = ServerConfig(base_models=[TINY], auth=LOOPBACK)
    tiny = cfg.base_model("tiny")
    assert tiny.trainer.num_workers == 2
    assert tiny.trainer_groups() == {"tiny": tiny.trainer}
    assert tiny.trainer_for("policy") == tiny.trainer_for("critic") == "tiny"  # one shared worker group
    assert cfg.base_model("other") is None
    assert (cfg.limits, cfg.timeouts, cfg.retention, cfg.quotas, cfg.engine) == (
        LimitsConfig(),
        TimeoutsConfig(),
        RetentionConfig(),
        QuotasConfig(),
        EngineConfig(),
    )
    assert cfg.db_url == f"sqlite+aiosqlite:///{Path('state').resolve() / 'tinker_serve.db'}"
    assert (
        ServerConfig(base_models=[TINY], auth=LOOPBACK, database_url="postgresql+asyncpg://h/db").db_url
        == "postgresql+asyncpg://h/db"
    )


def test_critics_on_their_own_trainer() -> None:
    tiny = ServerConfig(base_models=[{**TINY, "critic_trainer": {"num_workers": 1}}], auth=LOOPBACK).base_model("tiny")
    assert (tiny.trainer_for("policy"), tiny.trainer_for("critic")) == ("tiny", "tiny:critic")
    assert tiny.trainer_groups()["tiny:critic"].num_workers == 1
    assert tiny.trainer_groups()["tiny"].num_workers == 2


@pytest.mark.parametrize(
    ("base", "cores", "after"),
    [
        ({}, 2, True),  # the embedded default on 2 cores: two ranks, vLLM and its replica share them
        ({}, 4, False),  # a core each
        ({"trainer": {"torch_threads_per_worker": 4}}, 8, True),
        ({"trainer": {"use_gpu": True}}, 2, False),
        ({"sampler": {"num_gpus": 1}}, 2, False),
        ({"trainer": {"resources": {"trainer_node": 1}}}, 2, False),  # placed on nodes of their own
        ({"sampler": {"resources": {"sampler_node": 1}}}, 2, False),
        (SHARED_GPU, 64, True),  # one GPU shared: vLLM profiles its free memory once the trainer's base is loaded
        ({**SHARED_GPU, "sampler": {"num_gpus": 1}}, 64, False),
        ({**SHARED_GPU, "trainer": {**SHARED_GPU["trainer"], "resources": {"trainer_node": 1}}}, 64, False),
    ],
)
def test_sampler_starts_after_trainer_only_where_they_share_cores_or_a_gpu(base: dict, cores: int, after: bool) -> None:
    config = ServerConfig(base_models=[{**TINY, **base}], auth=LOOPBACK)
    assert config.base_model("tiny").sampler_starts_after_trainer(cores) is after


def test_empty_base_models_rejected() -> None:
    with pytest.raises(ValidationError, match="at least one model"):
        ServerConfig(base_models=[], auth=LOOPBACK)


def test_duplicate_names_rejected() -> None:
    with pytest.raises(ValidationError, match="unique"):
        ServerConfig(base_models=[TINY, {**TINY, "path": "elsewhere"}], auth=LOOPBACK)


@pytest.mark.parametrize(
    "args",
    [
        {"base_models": [TINY], "auth": LOOPBACK, "stat_dir": "typo"},
        {"base_models": [{**TINY, "gpus": 1}], "auth": LOOPBACK},
        {"base_models": [TINY], "auth": {**LOOPBACK, "keys": ["k"]}},
        {"base_models": [TINY], "auth": LOOPBACK, "limits": {"max_datums": 3}},
        {"base_models": [TINY], "auth": LOOPBACK, "timeouts": {"long_poll": 3}},
        {"base_models": [TINY], "auth": LOOPBACK, "engine": {"max_datums_per_request": 3}},  # in another section
    ],
)
def test_unknown_keys_rejected(args: dict) -> None:
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        ServerConfig(**args)


@pytest.mark.parametrize(
    "section, values, message",
    [
        ("limits", {"max_datums_per_request": 0}, "limits.max_datums_per_request"),
        ("timeouts", {"long_poll_seconds": 41}, "timeouts.long_poll_seconds"),
        ("retention", {"audit_retention_days": 0}, "retention.audit_retention_days"),
        ("quotas", {"max_pending_samples": 0}, "quotas.max_pending_samples"),
        ("engine", {"max_lora_rank": 0}, "engine.max_lora_rank"),
        (
            "retention",
            {"min_checkpoint_ttl_seconds": 7200, "max_checkpoint_ttl_seconds": 3600},
            "min_checkpoint_ttl_seconds exceeds retention.max_checkpoint_ttl_seconds",
        ),
    ],
)
def test_section_bounds(section: str, values: dict, message: str) -> None:
    with pytest.raises(ValidationError) as info:
        ServerConfig(base_models=[TINY], auth=LOOPBACK, **{section: values})
    assert message in str(info.value)


def test_one_user_cannot_fill_a_trainer_across_sections() -> None:
    with pytest.raises(
        ValidationError, match=r"quotas\.max_live_models_per_user 8 must be below engine\.max_models_per_base 8"
    ):
        ServerConfig(
            base_models=[TINY], auth=LOOPBACK, engine={"max_models_per_base": 8}, quotas={"max_live_models_per_user": 8}
        )
    config = ServerConfig(
        base_models=[TINY], auth=LOOPBACK, engine={"max_models_per_base": 9}, quotas={"max_live_models_per_user": 8}
    )
    assert config.quotas.max_live_models_per_user == 8


def test_a_users_own_quotas_override_the_server_wide_ones() -> None:
    quotas = {"max_live_models_per_user": 4, "users": {"alice": {"max_live_models_per_user": 6}}}
    config = ServerConfig(base_models=[TINY], auth=LOOPBACK, engine={"max_models_per_base": 8}, quotas=quotas)
    alice, bob = config.quotas.for_user("alice"), config.quotas.for_user("bob")
    assert (alice.max_live_models_per_user, bob.max_live_models_per_user) == (6, 4)
    assert alice.max_pending_requests_per_user == bob.max_pending_requests_per_user == 1024  # the rest unchanged
    crowded = {**quotas, "users": {"alice": {"max_live_models_per_user": 8}}}
    with pytest.raises(ValidationError, match=r"max_live_models_per_user of alice 8 must be below"):
        ServerConfig(base_models=[TINY], auth=LOOPBACK, engine={"max_models_per_base": 8}, quotas=crowded)
    with pytest.raises(ValidationError, match=r"max_pending_samples"):  # only the per-user quotas are a user's own
        ServerConfig(base_models=[TINY], auth=LOOPBACK, quotas={"users": {"alice": {"max_pending_samples": 1}}})


def test_a_user_may_have_each_per_user_quota_of_their_own() -> None:
    """UserQuotas lists QuotasConfig's *_per_user fields by hand: a new one must be added there too."""
    assert set(UserQuotas.model_fields) == {name for name in QuotasConfig.model_fields if name.endswith("_per_user")}


def test_every_field_that_left_limits_is_named_with_its_new_place() -> None:
    assert set(MOVED_FROM_LIMITS.values()) == {"timeouts", "retention", "quotas", "engine"}
    names = [name for model in SECTIONS.values() for name in model.model_fields]
    assert len(names) == len(set(names))  # each field in one section
    assert set(MOVED_FROM_LIMITS) <= set(names)  # every field that left limits is in its new section
    old = {"long_poll_seconds": 30, "max_lora_rank": 8, "max_datums_per_request": 8, "audit_retention_days": 30}
    with pytest.raises(ValidationError) as info:
        ServerConfig(base_models=[TINY], auth=LOOPBACK, limits=old)
    message = str(info.value)
    assert "limits.long_poll_seconds moved to timeouts.long_poll_seconds" in message
    assert "limits.max_lora_rank moved to engine.max_lora_rank" in message
    assert "limits.audit_retention_days moved to retention.audit_retention_days" in message
    assert "Extra inputs" not in message and "max_datums_per_request" not in message  # that one stays in limits
    for name, section in MOVED_FROM_LIMITS.items():
        with pytest.raises(ValidationError, match=f"limits.{name} moved to {section}.{name}"):
            ServerConfig.model_validate({"base_models": [TINY], "auth": LOOPBACK, "limits": {name: 1}})


def _config_models(model: type[BaseModel], seen: set[type[BaseModel]]) -> set[type[BaseModel]]:
    """`model` and every config model its fields hold, through optionals, lists and dicts."""
    if model in seen:
        return seen
    seen.add(model)
    for field in model.model_fields.values():
        pending = [field.annotation]
        while pending:
            hint = pending.pop()
            if isinstance(hint, type) and issubclass(hint, BaseModel):
                _config_models(hint, seen)
            elif isinstance(hint, types.UnionType) or typing.get_origin(hint) is not None:
                pending += typing.get_args(hint)
    return seen


def test_every_config_field_has_a_description() -> None:
    models = _config_models(ServerConfig, set())
    assert {m.__name__ for m in models} >= {
        "ServerConfig",
        "BaseModelConfig",
        "WorkerGroupConfig",
        "SamplerConfig",
        "AuthConfig",
        "FeaturesConfig",
        *(model.__name__ for model in SECTIONS.values()),
    }
    undescribed = sorted(
        f"{model.__name__}.{name}"
        for model in models
        for name, field in model.model_fields.items()
        if not (field.description or "").strip()
    )
    assert undescribed == []


def test_the_walk_finds_an_undescribed_field() -> None:
    class Inner(BaseModel):
        bare: int = 1

    class Outer(BaseModel):
        inner: list[Inner] | None = None

    assert Inner in _config_models(Outer, set())
    assert Inner.model_fields["bare"].description is None


@pytest.mark.parametrize(
    "section, resources, message",
    [
        ("trainer", {"CPU": 2}, "may not name 'CPU'"),
        ("sampler", {"GPU": 1}, "may not name 'GPU'"),
        ("sampler", {"sampler_node": -1}, "must be >= 0"),
    ],
)
def test_custom_resources_checked(section: str, resources: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=f"base_models.0.{section}[\\s\\S]*{message}"):
        ServerConfig(base_models=[{**TINY, section: {"resources": resources}}], auth=LOOPBACK)


def test_custom_resources_reach_workers_and_replicas() -> None:
    from deployments.sampler import Sampler

    config = ServerConfig(
        base_models=[
            {**TINY, "trainer": {"resources": {"trainer_node": 1}}, "sampler": {"resources": {"sampler_node": 0.5}}}
        ],
        auth=LOOPBACK,
    )
    assert config.base_models[0].trainer_groups()[TINY["name"]].resources == {"trainer_node": 1}
    options = Sampler.deployment_options(config, TINY["name"])
    assert options["ray_actor_options"]["resources"] == {"sampler_node": 0.5}


@pytest.mark.parametrize(
    "base, message",
    [
        ({"trainer": {"gpus_per_worker": 0.5}}, "are for GPU ranks: set use_gpu: true"),
        ({"trainer": {"gpu_memory_fraction": 0.5}}, "are for GPU ranks: set use_gpu: true"),
        ({"trainer": {"num_workers": 2, "use_gpu": True, "gpus_per_worker": 0.5}}, "a group of one rank only"),
        ({"critic_trainer": {"num_workers": 2, "use_gpu": True, "gpus_per_worker": 0.5}}, "a group of one rank only"),
        ({"sampler": {"num_gpus": 0.5, "tensor_parallel_size": 2}}, "tensor_parallel_size 2 spans GPUs"),
        (
            {**SHARED_GPU, "sampler": {"num_gpus": 0.5, "gpu_memory_utilization": 0.6}},
            r"gpu_memory_fraction 0.5 \+ sampler.gpu_memory_utilization 0.6 > 1",
        ),
        (
            {**SHARED_GPU, "critic_trainer": {**SHARED_GPU["trainer"], "gpu_memory_fraction": 0.7}},
            "trainer tiny:critic's ranks and the sampler's replicas share a GPU",
        ),
    ],
)
def test_gpu_shares_checked(base: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ServerConfig(base_models=[{**TINY, **base}], auth=LOOPBACK)


def test_gpu_shares_reach_the_worker_group_and_the_sampler_replicas() -> None:
    """The Ray reservations: a CPU rank its CPUs, a GPU rank a whole GPU by default or its share, each in the bundle
    Ray Train reserves per rank; a Sampler replica its num_gpus."""
    from app.trainer.worker_group import scaling_config, worker_bundles
    from deployments.sampler import Sampler

    config = ServerConfig(base_models=[{**TINY, **SHARED_GPU}], auth=LOOPBACK)
    base = config.base_model("tiny")
    assert base.shares_a_gpu()
    assert worker_bundles(base.trainer) == [{"CPU": 1.0, "GPU": 0.5}]
    assert scaling_config(base.trainer).use_gpu
    assert Sampler.deployment_options(config, "tiny")["ray_actor_options"]["num_gpus"] == 0.5
    cpu = ServerConfig(base_models=[TINY], auth=LOOPBACK).base_model("tiny").trainer
    assert worker_bundles(cpu) == [{"CPU": 1.0}] * 2
    whole = cpu.model_copy(update={"use_gpu": True, "resources": {"gpu_node": 1}})
    assert worker_bundles(whole) == [{"CPU": 1.0, "GPU": 1.0, "gpu_node": 1}] * 2


def test_a_rank_caps_its_torch_memory_at_its_share(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from app.ranks.command_loop import cap_gpu_memory

    calls: list[tuple[float, torch.device]] = []
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d: calls.append((f, d)))
    shared = ServerConfig(base_models=[{**TINY, **SHARED_GPU}], auth=LOOPBACK).base_model("tiny").trainer
    cap_gpu_memory(shared, "cuda:0")
    cap_gpu_memory(shared.model_copy(update={"gpu_memory_fraction": None}), "cuda:0")  # no cap
    cap_gpu_memory(ServerConfig(base_models=[TINY], auth=LOOPBACK).base_model("tiny").trainer, "cpu")
    assert calls == [(0.5, torch.device("cuda:0"))]


def test_a_cpu_sampler_preloads_tcmalloc_where_it_is_installed(tmp_path: Path) -> None:
    """vLLM's CPU advice: the replica's environment preloads tcmalloc when the library is there, and not otherwise;
    the sampler's own `env` can turn it off."""
    from deployments.sampler import Sampler

    installed = tmp_path / "libtcmalloc_minimal.so.4"
    installed.write_bytes(b"")
    assert replica_env(installed)["LD_PRELOAD"] == str(installed)
    assert "LD_PRELOAD" not in replica_env(tmp_path / "missing.so")
    config = ServerConfig(base_models=[{**TINY, "sampler": {"env": {"LD_PRELOAD": ""}}}], auth=LOOPBACK)
    assert (
        Sampler.deployment_options(config, TINY["name"])["ray_actor_options"]["runtime_env"]["env_vars"]["LD_PRELOAD"]
        == ""
    )


def test_cpu_ranks_preload_tcmalloc_unless_configured_otherwise() -> None:
    """The trainer's ranks get tcmalloc where it is installed (glibc keeps a long pass's freed activations resident),
    GPU ranks do not, and `trainer.env` overrides either way."""
    from app.allocator import preload_tcmalloc
    from app.trainer.worker_group import rank_env

    cpu = ServerConfig(base_models=[TINY], auth=LOOPBACK).base_model("tiny").trainer
    assert rank_env(cpu) == preload_tcmalloc()
    gpu = cpu.model_copy(update={"use_gpu": True, "env": {"NCCL_DEBUG": "WARN"}})
    assert rank_env(gpu) == {"NCCL_DEBUG": "WARN"}
    without = ServerConfig(
        base_models=[{**TINY, "trainer": {"env": {"LD_PRELOAD": "", "OMP_NUM_THREADS": "1"}}}], auth=LOOPBACK
    )
    assert rank_env(without.base_model("tiny").trainer) == {"LD_PRELOAD": "", "OMP_NUM_THREADS": "1"}


def test_api_keys_mode_needs_keys_where_they_are_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = ServerConfig(base_models=[TINY])  # api_keys is the default mode: validation reads no keys
    with pytest.raises(ValueError, match=f"auth.mode is api_keys but no keys are configured: set {API_KEYS_ENV}"):
        cfg.auth.load_keys()
    assert ServerConfig(base_models=[TINY], auth=LOOPBACK).auth.load_keys() == frozenset()

    import deployments.builder

    monkeypatch.setattr(deployments.builder, "route_app_logs", lambda: None)
    monkeypatch.setattr(deployments.builder, "_model_limits", lambda config: pytest.fail("built past missing keys"))
    with pytest.raises(ValueError, match=API_KEYS_ENV):  # `serve run` fails before anything is built or bound
        deployments.builder.build_app({"base_models": [TINY]})


def test_validation_reads_no_key_file(tmp_path: Path) -> None:
    missing = tmp_path / "not-mounted-here"
    cfg = ServerConfig(base_models=[TINY], auth={"mode": "api_keys", "api_keys_file": str(missing)})
    assert cfg.auth.api_keys_file == str(missing)  # a trainer or sampler replica validates without the secret
    with pytest.raises(FileNotFoundError):
        cfg.auth.load_keys()  # the ingress, which checks keys, needs it


def test_api_keys_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(API_KEYS_ENV, " key-one, ,key-two ")
    cfg = ServerConfig(base_models=[TINY], auth={"mode": "api_keys"})
    assert cfg.auth.load_keys() == frozenset({"key-one", "key-two"})


def test_api_keys_from_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text("# comment\nfile-key\n\n  spaced-key  \n")
    monkeypatch.setenv(API_KEYS_ENV, "env-key")
    auth = AuthConfig(mode="api_keys", api_keys_file=str(keys))
    assert auth.load_keys() == frozenset({"env-key", "file-key", "spaced-key"})
    assert ServerConfig(base_models=[TINY], auth=auth).auth.mode == "api_keys"


def test_resolved_makes_local_paths_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "local-model").mkdir()
    cfg = ServerConfig(
        state_dir="st",
        auth=LOOPBACK,
        base_models=[
            TINY,
            {"name": "local", "path": "local-model"},
            {"name": "hub", "path": "Qwen/Qwen3-8B"},
            {"name": "dotted", "path": "./not-yet"},
        ],
    ).resolved()
    assert cfg.state_dir == str(tmp_path / "st")
    assert [m.path for m in cfg.base_models] == [
        str(tmp_path / "models" / "tiny"),  # embedded: absolute even before it is built
        str(tmp_path / "local-model"),
        "Qwen/Qwen3-8B",  # a hub id stays as it is
        str(tmp_path / "not-yet"),
    ]
    assert cfg.db_url == f"sqlite+aiosqlite:///{tmp_path / 'st' / 'tinker_serve.db'}"
    assert cfg.checkpoint_uri == str(tmp_path / "st" / "checkpoints")
    relative = ServerConfig(base_models=[TINY], auth=LOOPBACK, storage_uri="ckpts").resolved()
    assert relative.checkpoint_uri == str(tmp_path / "ckpts")


def test_secrets_come_from_the_environment_and_stay_out_of_deployment_args(monkeypatch: pytest.MonkeyPatch) -> None:
    url, uri = "postgresql+asyncpg://u:p@db/tinker", "s3://bucket/prefix?region=us-east-1"
    monkeypatch.setenv(DATABASE_URL_ENV, url)
    monkeypatch.setenv(STORAGE_URI_ENV, uri)
    cfg = ServerConfig(base_models=[TINY], auth=LOOPBACK).resolved()
    assert (cfg.db_url, cfg.checkpoint_uri) == (url, uri)
    assert url not in str(cfg.model_dump()) and uri not in str(cfg.model_dump())  # what replicas receive
    explicit = ServerConfig(base_models=[TINY], auth=LOOPBACK, storage_uri="gs://other/x").resolved()
    assert explicit.checkpoint_uri == "gs://other/x"  # config wins over the environment


def test_config_is_frozen() -> None:
    cfg = ServerConfig(base_models=[TINY], auth=LOOPBACK)
    with pytest.raises(ValidationError):
        cfg.state_dir = "x"


def test_shipped_serve_config_validates() -> None:
    doc = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    app = doc["applications"][0]
    assert app["import_path"] == "deployments.builder:build_app"
    cfg = ServerConfig.model_validate(app["args"])
    assert cfg.auth.mode == "any_tml_key_on_loopback"
    assert [m.name for m in cfg.base_models] == ["tinker-serve/tiny"]
    assert cfg.base_models[0].embedded_preset == "tiny"
