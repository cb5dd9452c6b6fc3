"""One Ray instance and one Serve app (real Trainer with TorchTrainer workers) for the whole session."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import ray
import tinker
from ray import serve

from app.db.keys import enrolled_owner
from app.models.embedded import build_embedded_model
from app.training.base_model import load_base_model
from deployments.builder import build_app
from tests.conftest import API_PORT, TINY_MODEL, free_port
from tests.integration.helpers import raw_client, raw_session_with_model
from tests.postgres import PostgresServer
from tests.s3 import S3_ENV, s3_server

BASE_MODEL = "tinker-serve/tiny"
BF16_MODEL = "tinker-serve/tiny-bf16"
CHUNK_LEN = 4  # the server tells clients to send at most 4 datums per forward_backward request
MAX_TOKENS = 256  # the cookbook's rl_loop.py prompt (its few-shot example) is 217 tokens
EPHEMERAL_TTL_S = 15.0  # short, so one test can watch an ephemeral sampler expire
MAX_LORAS = 2  # fewer vLLM LoRA slots than adapters in use: the scheduler must rotate them
MAX_PENDING_SAMPLES = 16  # beyond it asample answers 429
SESSION_TIMEOUT_S = 30.0  # a session silent this long expires (the SDK beats every 10 s; the least allowed)
HANDOVER_CHECK_S = 3.0  # lost hand-overs found within 3-6 s (test_worker_failure waits for one)
MAX_STABILITY_RECORDS = 600  # per session: small, so a test can reach it
MIN_CHECKPOINT_TTL_S = 2  # the hosted minimum is an hour: short, so a test can watch checkpoints expire
QUOTAS = {  # test_quotas' users' own (quotas.users): tight, so each limit is reached
    "max_live_models_per_user": 2,
    "max_checkpoint_bytes_per_user": 1,  # the first save is let in (nothing held yet); the next is refused
    "max_pending_requests_per_user": 3,
    "sample_tokens_per_minute_per_user": 40,
}
QUOTA_KEYS = ("tml-quota-sizes", "tml-quota-other", "tml-quota-rates", "tml-quota-sdk", "tml-hostile-countdown")


SHARDED = {"sharding": "fsdp", "activation_checkpointing": True}  # what auto gives a real model, on the tiny one
BF16_TWIN = {  # the same model trained and sampled in bfloat16 (test_precision)
    "name": BF16_MODEL,
    "path": str(TINY_MODEL),
    "embedded_preset": "tiny",
    "trainer": {"num_workers": 2, "cpus_per_worker": 0.5, "dtype": "bfloat16", "autocast": True, **SHARDED},
    "sampler": {"kv_cache_mib": 32, "num_cpus": 0.5},
}


def server_config(state_dir: Path, sharded: bool = False) -> dict:
    """The suite's app: the tiny model on two workers, each holding all of it without recompute (as serve_config.yaml
    runs it: on 2 cores a sharded base's many small collectives made the suite 2x slower). `sharded`: the
    `sharded_app` fixture's, with the base sharded (fsdp) and recomputed, and the model's bfloat16 twin, critics on
    the base's own trainer."""
    return {
        "state_dir": str(state_dir),
        # admins read all audit events; SDK clients trade their keys for JWTs (app.api.tokens)
        "auth": {"mode": "any_tml_key_on_loopback", "admin_users": ["ops-admin"], "jwt_enabled": True},
        "base_models": [
            {
                "name": BASE_MODEL,
                "path": str(TINY_MODEL),
                "embedded_preset": "tiny",
                # float32 whatever the machine: the suite compares against float32 references to ~1e-5; passes of
                # 1024 tokens, so the failure tests' requests run in several passes per rank
                "trainer": {
                    "num_workers": 2,
                    "cpus_per_worker": 1,
                    "snapshot_every_steps": 3,
                    "dtype": "float32",
                    "micro_batch_tokens": 1024,
                    # sharded: datums of more than 12 tokens are split across the two ranks (sequence parallelism),
                    # so the failure tests' recoveries replay split datums (test_helpers' sentences are 10-16 tokens)
                    **(
                        {"sequence_parallel_min_tokens": 12, **SHARDED}
                        if sharded
                        else {"sharding": "replicate", "activation_checkpointing": False}
                    ),
                },
                # critics on a worker group of their own; none on the sharded app, whose tests train no critic
                **({} if sharded else {"critic_trainer": {"num_workers": 1, "cpus_per_worker": 1, "dtype": "float32"}}),
                "sampler": {"kv_cache_mib": 64, "max_loras": MAX_LORAS, "max_cpu_loras": 6},
            },
            *([BF16_TWIN] if sharded else []),
        ],
        "limits": {"fwdbwd_max_chunk_len": CHUNK_LEN, "max_tokens_per_datum": MAX_TOKENS},
        "timeouts": {
            "session_timeout_seconds": SESSION_TIMEOUT_S,
            "handover_check_seconds": HANDOVER_CHECK_S,
        },
        "retention": {
            "ephemeral_sampler_ttl_seconds": EPHEMERAL_TTL_S,
            "min_checkpoint_ttl_seconds": MIN_CHECKPOINT_TTL_S,
            "checkpoint_sweep_seconds": 1,
        },
        "quotas": {
            "max_pending_samples": MAX_PENDING_SAMPLES,
            "max_pending_samples_per_user": MAX_PENDING_SAMPLES,  # the suite samples as one user: the whole pool
            "max_stability_records_per_session": MAX_STABILITY_RECORDS,
            "max_live_models_per_user": 999,  # the suite's shared user keeps well over the default 32 loaded
            "users": {enrolled_owner(key): QUOTAS for key in QUOTA_KEYS},  # the users an unissued key stands for
        },
        # max_models_per_base: the suite keeps its models loaded, well over the default 64 on the shared app
        "engine": {"max_lora_rank": 16, "max_models_per_base": 1000},
    }


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules with a Ray of their own (a bare `serve run`, a multi-node cluster) run before the shared Ray
    starts, in this order; modules that replace the shared Serve app run last, in this order (every module on the
    families app among them: a module that replaced the shared app in the middle failed every one after it)."""
    first = ("test_bare_serve_run.py", "test_multinode.py")
    last = (
        "test_precision.py",
        "test_worker_failure.py",
        "test_object_storage.py",
        "test_families.py",
        "test_vlm_classifier.py",
        "test_image_sampling.py",
        "test_postgres_app.py",
    )
    stray = {item.path.name for item in items if "families_on_postgres" in item.fixturenames} - set(last)
    assert not stray, f"{sorted(stray)} use the families app: name them in conftest's `last` modules"
    items.sort(
        key=lambda item: (
            first.index(item.path.name) - len(first)
            if item.path.name in first
            else last.index(item.path.name) + 1
            if item.path.name in last
            else 0
        )
    )


def wait_ready(
    url: str,
    budget_s: float = 300,
    route: str = "/ready",
    every_s: float = 1.0,
    check: Callable[[], None] | None = None,
    done: Callable[[httpx.Response], bool] = lambda answer: answer.status_code == 200,
) -> None:
    """Until `route`'s answer is `done` (by default 200: for /ready, once every trainer and sampler answers). An
    answer slower than 10 s counts as not yet (on 2 cores a deploying app's engines starting can hold the ingress
    that long), and so does a refused connection: under direct ingress nothing listens on the port until the app's
    Ingress replica starts its own server. `check` runs before each try (to fail at once when the server died)."""
    deadline = time.monotonic() + budget_s
    while True:
        if check is not None:
            check()
        try:
            if done(httpx.get(f"{url}{route}", timeout=10)):
                return
        except (httpx.TimeoutException, httpx.ConnectError):
            pass
        assert time.monotonic() < deadline, f"the Serve app's {route} never answered as awaited within {budget_s:g} s"
        time.sleep(every_s)


# Set once the shared URL serves an app on another database than the standard one's: the shared client's session is
# not in it. Kept in the environment: test modules import this file under another module name than pytest does.
_ON_ANOTHER_DATABASE = "TINKER_SERVE_TEST_APP_ON_ANOTHER_DATABASE"
_STANDARD_STATE_DIR = "TINKER_SERVE_TEST_STANDARD_STATE_DIR"  # the standard app's state_dir
_SILENT_SESSION = "TINKER_SERVE_TEST_SILENT_SESSION"  # "session_id model_id" (the silent_session fixture)


def replace_app(config: dict, url: str, while_starting: Callable[[], None] | None = None) -> None:
    """Delete the shared Serve app and start one with `config` in its place (clients keep the same URL);
    `while_starting` runs once the new app's ingress answers, before the app is ready."""
    standard = "database_url" not in config and config["state_dir"] == os.environ[_STANDARD_STATE_DIR]
    os.environ[_ON_ANOTHER_DATABASE] = "" if standard else "1"
    serve.delete("tinker", _blocking=False)  # the trainers' graceful shutdown waits up to 60 s for a submit
    app = build_app(config)  # meanwhile (the new bases' embedded models are built here)
    # Polled often (each look is one call to Serve's controller or Ray's GCS): the new app starts the moment the old
    # one is gone and its placement groups are freed
    deadline = time.monotonic() + 240  # left waiting, so this can take longer than serve's own wait
    while "tinker" in serve.status().applications:
        assert time.monotonic() < deadline, "the app was never deleted"
        time.sleep(0.2)
    deadline = time.monotonic() + 120  # the trainers end their Ray Train runs, which frees their placement groups
    while ray.available_resources().get("CPU", 0) < ray.cluster_resources()["CPU"]:
        assert time.monotonic() < deadline, f"the deleted app still holds CPUs: {ray.util.placement_group_table()}"
        time.sleep(0.2)
    if while_starting is None:
        serve.run(app, name="tinker", route_prefix="/")
    else:  # serve.run returns once every deployment runs: in a thread, while this one waits for the ingress alone
        deploying = threading.Thread(target=serve.run, args=(app,), kwargs={"name": "tinker", "route_prefix": "/"})
        deploying.start()
        wait_ready(url, budget_s=120, route="/api/v1/healthz", every_s=0.2)  # the new app's ingress answers
        while_starting()
        deploying.join(timeout=300)
    wait_ready(url)


@pytest.fixture(scope="session")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("state")


# Ray's Prometheus endpoint on this node, http://127.0.0.1:{port}/metrics. Kept in the environment: test modules
# import this file under another module name than pytest does, and both must agree on the port.
METRICS_PORT = int(os.environ.setdefault("TINKER_SERVE_TEST_METRICS_PORT", str(free_port())))


@pytest.fixture(scope="session")
def base_url(state_dir: Path) -> str:
    build_embedded_model("tiny", TINY_MODEL)
    os.environ[_STANDARD_STATE_DIR] = str(state_dir)
    ray_tmp = Path("/tmp") / f"tsray-{int(time.time())}"  # short: Ray's socket paths have a length limit
    # The dashboard (on 127.0.0.1) serves Ray's state API, which Ray Train's cleaner needs to release a killed
    # trainer's placement group, as on real clusters. S3_ENV: for test_object_storage.
    ray.init(
        num_cpus=8,
        include_dashboard=True,
        _temp_dir=str(ray_tmp),
        _metrics_export_port=METRICS_PORT,
        runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1", "RAY_AUTH_MODE": "disabled", **S3_ENV}},
    )
    serve.start(http_options={"host": "127.0.0.1", "port": free_port()})  # Serve's proxy: unused by the tests
    started = time.monotonic()
    serve.run(build_app(server_config(state_dir)), name="tinker", route_prefix="/")
    assert API_PORT is not None, "the tests run Serve with direct ingress on one port (deployments/serve_env.py)"
    url = f"http://127.0.0.1:{API_PORT}"  # the Ingress replica's own server (direct ingress)
    wait_ready(url)
    print(f"\nServe app ready in {time.monotonic() - started:.1f} s at {url}")
    with raw_client(url, "tml-integration-tests") as http:  # the `silent_session` fixture's
        os.environ[_SILENT_SESSION] = " ".join(raw_session_with_model(http, BASE_MODEL))
    yield url
    serve.shutdown()
    ray.shutdown()


@pytest.fixture(scope="session")
def silent_session(base_url: str) -> tuple[str, str]:
    """(session id, model id) of a raw session holding one model that never heartbeats, made the moment the shared
    app came up: its timeout runs out while the suite goes on, so test_sessions need not wait it out."""
    session, model_id = os.environ[_SILENT_SESSION].split()
    return session, model_id


@pytest.fixture(scope="session")
def object_store() -> Iterator[str]:
    """The storage URI of a bucket on an S3-compatible server on loopback (moto), for the rest of the session."""
    with s3_server("tinker-serve") as uri:
        yield uri


def sharded_config(state_dir: Path, storage_uri: str) -> dict:
    """The `sharded_app`'s config: `server_config(sharded=True)` with its checkpoints and snapshots in object
    storage at `storage_uri`, as on a cluster."""
    return {**server_config(state_dir, sharded=True), "storage_uri": storage_uri}


@pytest.fixture(scope="session")
def sharded_state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sharded-state")


@pytest.fixture(scope="session")
def sharded_app(base_url: str, sharded_state_dir: Path, object_store: str) -> str:
    """The shared app replaced, once, by `sharded_config` on a state directory (and database) of its own:
    test_precision's bf16 twin, the failure tests' recoveries on a sharded base from snapshots in object storage, and
    test_object_storage. The modules that use it run after the others, before those that replace the app again. Its
    own database: on the shared one, every model the suite made so far is rebuilt at each of the failure tests'
    restarts."""
    replace_app(sharded_config(sharded_state_dir, object_store), base_url)
    return base_url


@pytest.fixture(scope="session")
def sharded_client(sharded_app: str) -> tinker.ServiceClient:
    """The suite's user on the `sharded_app` (its session is left to expire: the app is gone by the end)."""
    return tinker.ServiceClient(base_url=sharded_app, api_key="tml-integration-tests")


# family -> the served name of its base (the embedded preset after any org): a dense family and a lineup MoE hybrid
# (its experts through app.sampling.cpu_moe_lora, its Gated DeltaNet through app.sampling.cpu_gdn in the CPU Sampler),
# the hybrid served without an org as the Hub's `gpt2` is, so the SDK's get_tokenizer resolves such a name too. Every
# family's Sampler engine against its trainer's, in process: test_family_samplers.py (four bases took this app 150 s
# to start on 2 cores, two ~50 s)
FAMILY_BASES = {
    "qwen3": "tinker-serve/tiny-qwen3",
    "qwen3_5_moe": "tiny-qwen3_5-moe",
}


def _family_base(name: str, root: Path) -> dict:
    preset = name.rpartition("/")[2]
    return {
        "name": name,
        "path": str(root / preset),
        "embedded_preset": preset,
        "trainer": {"num_workers": 1, "cpus_per_worker": 0.5, "dtype": "float32"},
        "sampler": {"kv_cache_mib": 32, "num_cpus": 0.5, "dtype": "float32"},
    }


@pytest.fixture(scope="session")
def image_asset_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The families app's image asset root (`images.asset_roots`): image pointers may name files in it."""
    return tmp_path_factory.mktemp("image_assets")


@pytest.fixture(scope="session")
def families_on_postgres(
    base_url: str, postgres: PostgresServer, tmp_path_factory: pytest.TempPathFactory, image_asset_root: Path
) -> Iterator[str]:
    """The last app of the session (test_families, test_postgres_app): the shared app replaced by one serving a tiny
    base of each family in FAMILY_BASES, each built offline, whose `database_url` is a fresh database on the session's
    own PostgreSQL server. Yields that database's URL. Nothing runs after it, so the standard app is not brought back:
    the app is deleted while its database still runs."""
    root = tmp_path_factory.mktemp("families")
    url = postgres.url(postgres.create_database())
    config = {
        "state_dir": str(root / "state"),
        "database_url": url,
        "auth": {"mode": "any_tml_key_on_loopback"},
        "base_models": [_family_base(name, root) for name in FAMILY_BASES.values()],
        "engine": {"max_lora_rank": 8},  # vLLM sizes its LoRA buffers by it (x 2 for Qwen3-MoE's experts)
        "images": {"asset_roots": [str(image_asset_root)]},
    }
    replace_app(config, base_url)
    yield url
    serve.delete("tinker")
    assert not (root / "state" / "tinker_serve.db").exists(), "the app made a SQLite file beside its Postgres database"


@pytest.fixture(scope="session")
def service_client(base_url: str) -> tinker.ServiceClient:
    client = tinker.ServiceClient(base_url=base_url, api_key="tml-integration-tests")
    yield client
    if not os.environ.get(_ON_ANOTHER_DATABASE):  # its session lives in the standard app's database
        client.close("success").result()


@pytest.fixture(scope="session")
def reference_base():
    """The same base model loaded in this process: the single-worker, no-Ray reference."""
    return load_base_model(str(TINY_MODEL))
