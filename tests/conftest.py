"""Shared test set-up: one inductor cache for every test that compiles, logs in temp dirs."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Every test (and notebook) that compiles shares one cache: a cold compile costs ~20 s here, warm ~2 s.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(ROOT / ".inductor-cache"))
