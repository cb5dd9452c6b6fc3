#!/bin/bash
# Copied unchanged from the team's shared peer notes (../shared/peers/install_peer.sh, beside skyrl-cpu.md); only this line added.
# Reproducible install of the SkyRL tinker server (skyrl 0.4.0, JAX backend, CPU) on CPython 3.11.
# usage: install_peer.sh <venv dir>
PEER=${PEER:?set PEER to a scratch folder}; PEERS_DIR=${PEERS_DIR:-$(cd "$(dirname "$0")" && pwd)}; export PEER PEERS_DIR
set -e
V=${1:-$PEER/venv}
python3.11 -m venv $V
. $V/bin/activate
pip install -q -U pip
pip install -q torch==2.13.0   # peft + renderer import torch
pip install -q --no-deps --ignore-requires-python skyrl==0.4.0                       # declares Python>=3.12
pip install -q "datasets>=4.0.0" "pillow>=11.3.0" "rich>=14.1.0" "safetensors>=0.6.2" "tokenizers>=0.23.1" \
  "transformers>=5.6.1,<=5.16.1" "typer>=0.17.4" "peft==0.18.1" hf_transfer "cloudpathlib>=0.23.0" \
  "zstandard>=0.23.0" "xxhash>=3.0.0" \
  "tinker>=0.25.0,<0.26.0" "fastapi[standard]" sqlmodel "sqlalchemy[asyncio]" aiosqlite asyncpg psycopg2-binary \
  "jax>=0.8,<1.0" "optax>=0.2.5" psutil aiohttp \
  msgpack orbax-checkpoint tensorstore "treescope>=0.1.7" PyYAML
pip install -q --no-deps --ignore-requires-python flax==0.12.10                        # needs py>=3.12 / jax>=0.11.1 on paper
cat > $V/lib/python3.11/site-packages/sitecustomize.py <<'PY'
# skyrl 0.4.0 declares Python>=3.12; on 3.11 pydantic rejects typing.TypedDict, so alias it.
import sys
if sys.version_info < (3, 12):
    import typing, typing_extensions
    typing.TypedDict = typing_extensions.TypedDict
PY
python -c "import skyrl.tinker.api, skyrl.tinker.engine, skyrl.backends.jax; print('skyrl import ok')" 2>&1 | grep -v absl
