"""Shared test set-up: the repo root on sys.path, offline Hugging Face, the embedded tiny model path."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TINKER_TELEMETRY", "0")

TINY_MODEL = ROOT / "models" / "tiny"
