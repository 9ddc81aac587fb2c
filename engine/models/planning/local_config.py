"""What this machine holds of a model, without the network: the folder with its config.json
(Tandem's converted copy, a path, or the Hugging Face cache's snapshot), the config itself, and
the exact parameter count its safetensors headers give. No torch: the picker reads these on the
GUI thread."""
from __future__ import annotations

import json
import logging
import math
import struct
from pathlib import Path

from engine.core.paths import cache_dir

log = logging.getLogger(__name__)


def local_model_dir(repo: str | None, local_name: str | None = None) -> Path | None:
    """A folder on this machine holding ``repo``'s config.json: Tandem's converted copy
    (``local_name``), a path given as the repo, or the Hugging Face cache's snapshot. Never
    touches the network."""
    if local_name:
        folder = cache_dir() / "models" / local_name
        if (folder / "config.json").is_file():
            return folder
    if not repo:
        return None
    path = Path(repo).expanduser()
    if path.is_absolute() or repo.startswith("."):
        return path if (path / "config.json").is_file() else None
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(repo, "config.json")
    except Exception as exc:  # an odd repo name or cache layout: no config, not an error
        log.debug("no cached config for %s: %s", repo, exc)
        return None
    return Path(found).parent if isinstance(found, str) else None


def read_config(folder: Path) -> dict | None:
    try:
        data = json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        log.warning("ignoring unreadable %s: %s", folder / "config.json", exc)
        return None
    return data if isinstance(data, dict) else None


_FLOAT_DTYPES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "F8_E5M2": 1}


def safetensors_params(folder: Path) -> int | None:
    """Parameter count from the safetensors headers in ``folder`` (reads a few KB per file).
    None when there are none, or when weights are stored quantized (packed integer tensors do
    not count parameters)."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for path in files:
        try:
            with open(path, "rb") as f:
                (length,) = struct.unpack("<Q", f.read(8))
                if length > 100_000_000:
                    return None
                header = json.loads(f.read(length))
        except (OSError, struct.error, json.JSONDecodeError, UnicodeDecodeError):
            return None
        for name, info in header.items():
            if name == "__metadata__":
                continue
            if info.get("dtype") not in _FLOAT_DTYPES:
                return None
            total += math.prod(info.get("shape", []))
    return total or None
