"""Where Tandem keeps things on disk (platformdirs); TANDEM_HOME overrides all of them."""
from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP = "tandem"
REPO_ROOT = Path(__file__).resolve().parents[2]  # engine/core/paths.py -> the repo (or bundle) root
RESOURCES = REPO_ROOT / "resources"


def _base(kind: str) -> Path:
    home = os.environ.get("TANDEM_HOME")
    if home:
        return Path(home) / kind
    return Path(getattr(platformdirs, f"user_{kind}_dir")(APP, appauthor=False))


def cache_dir() -> Path:
    return _base("cache")


def data_dir() -> Path:
    return _base("data")


def log_dir() -> Path:
    return _base("log")
