"""GGUF models other apps already downloaded: LM Studio, llama.cpp and Ollama. Read only.

Where each keeps its models (their documented defaults; nothing here ever writes there):

- LM Studio: ``~/.lmstudio/models/<publisher>/<repo>/<file>.gguf`` (its docs' "expected
  directory structure"), and ``~/.cache/lm-studio/models`` with the same layout in older
  versions. LM Studio documents no environment variable for the folder (it is moved in the
  app's My Models tab), so those two are what is looked at.
- llama.cpp (``-hf`` downloads): ``$LLAMA_CACHE``, else ``$XDG_CACHE_HOME/llama.cpp`` or
  ``~/.cache/llama.cpp`` (``~/Library/Caches/llama.cpp`` on macOS, ``%LOCALAPPDATA%\\llama.cpp``
  on Windows), as its ``fs_get_cache_directory`` resolves it. Files are flat,
  ``<owner>_<repo>_<file>.gguf``, next to ``manifest=<owner>=<repo>=<tag>.json``: a manifest
  tells where the owner and repo end (both may hold underscores).
- Ollama: ``$OLLAMA_MODELS``, else ``~/.ollama/models`` (and the Linux service's
  ``/usr/share/ollama/.ollama/models``). ``manifests/<host>/<namespace>/<model>/<tag>`` is
  JSON whose ``layers`` entry of mediaType ``application/vnd.ollama.image.model`` names the
  weights' digest; the weights are ``blobs/sha256-<hex>``, a GGUF file without the extension.

Vision projectors (``mmproj-*.gguf``) are not models and are skipped, and so are the second and
later parts of split models (the first stands for the set); a split name that cannot be (part 1
of 0) is listed, for the listing to mark it. Only regular files are models: a FIFO or a link to
a device is never opened. An Ollama manifest is a few hundred bytes of JSON: it is read only
when it is a regular file of at most ``MANIFEST_MAX_BYTES`` (engine.core.bounded_json), so a
huge one, or one linked to /dev/zero, is skipped with a logged notice, never read whole.
"""
from __future__ import annotations

import logging
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from engine.core import bounded_json
from engine.gguf.reader import SPLIT_NAME
from engine.library.local_model import Source
from engine.library.registry import model_name

log = logging.getLogger(__name__)

OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
#: Ollama's manifests name a handful of layers: well under a KiB each.
MANIFEST_MAX_BYTES = 1 * 2**20
MANIFEST_MAX_DEPTH = 32
_DIGEST = re.compile(r"^sha256[:-](?P<hex>[0-9a-f]{64})$")


@dataclass(frozen=True)
class Found:
    """A model file found in another app's folder: ``path`` is its first (or only) part."""

    name: str
    path: Path
    source: Source


def lmstudio_roots() -> list[Path]:
    home = Path.home()
    return [home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"]


def llama_cpp_root() -> Path:
    if os.environ.get("LLAMA_CACHE"):
        return Path(os.environ["LLAMA_CACHE"]).expanduser()
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "llama.cpp"
    if sys.platform == "win32" and os.environ.get("LOCALAPPDATA"):
        return Path(os.environ["LOCALAPPDATA"]) / "llama.cpp"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "llama.cpp"


def ollama_roots() -> list[Path]:
    if os.environ.get("OLLAMA_MODELS"):
        return [Path(os.environ["OLLAMA_MODELS"]).expanduser()]
    roots = [Path.home() / ".ollama" / "models"]
    if sys.platform.startswith("linux"):
        roots.append(Path("/usr/share/ollama/.ollama/models"))
    return roots


def _is_model_file(path: Path) -> bool:
    name = path.name.lower()
    if not name.endswith(".gguf") or name.startswith("mmproj") or not path.is_file():
        return False
    split = SPLIT_NAME.match(path.name)
    # A later part of a split is stood for by its first; a name no split has is listed (and marked).
    return split is None or not 2 <= int(split["no"]) <= int(split["count"])


def find_lmstudio() -> list[Found]:
    found = []
    for root in lmstudio_roots():
        if not root.is_dir():
            continue
        # <publisher>/<repo>/<file>.gguf; LM Studio also lists <folder>/<file>.gguf.
        for path in sorted([*root.glob("*/*/*.gguf"), *root.glob("*/*.gguf")]):
            if _is_model_file(path):
                folders = path.relative_to(root).parent.as_posix()
                found.append(Found(f"{folders}/{model_name(path)}", path, "lmstudio"))
    return found


def find_llama_cpp() -> list[Found]:
    root = llama_cpp_root()
    if not root.is_dir():
        return []
    prefixes = []
    for manifest in root.glob("manifest=*.json"):
        fields = manifest.name[len("manifest="):-len(".json")].split("=")
        if len(fields) >= 2:
            prefixes.append((f"{fields[0]}_{fields[1]}_", f"{fields[0]}/{fields[1]}"))
    prefixes.sort(key=lambda p: -len(p[0]))  # the longest owner_repo_ prefix that fits
    found = []
    for path in sorted(root.glob("*.gguf")):
        if not _is_model_file(path):
            continue
        name = model_name(path)
        for prefix, repo in prefixes:
            if path.name.startswith(prefix):
                name = f"{repo}/{model_name(path.with_name(path.name[len(prefix):]))}"
                break
        found.append(Found(name, path, "llama.cpp"))
    return found


def ollama_name(host: str, namespace: str, model: str, tag: str) -> str:
    """How ``ollama list`` names a model: ``model:tag`` for the official library."""
    if host == "registry.ollama.ai":
        return f"{model}:{tag}" if namespace == "library" else f"{namespace}/{model}:{tag}"
    return f"{host}/{namespace}/{model}:{tag}"


def ollama_blob(root: Path, manifest: Path) -> Path | None:
    """The weights blob a manifest names (None where it names none or the blob is missing)."""
    try:
        data = bounded_json.load(manifest, MANIFEST_MAX_BYTES, MANIFEST_MAX_DEPTH)
    except (OSError, ValueError) as exc:
        log.info("skipping Ollama manifest %s (%s)", manifest, exc)
        return None
    layers = data.get("layers") if isinstance(data, dict) else None
    for layer in layers if isinstance(layers, list) else []:
        if isinstance(layer, dict) and layer.get("mediaType") == OLLAMA_MODEL_LAYER:
            match = _DIGEST.match(str(layer.get("digest", "")))
            if match is None:  # the digest names the file: never follow anything else
                return None
            blob = root / "blobs" / f"sha256-{match['hex']}"
            return blob if blob.is_file() else None
    return None


def find_ollama() -> list[Found]:
    found = []
    for root in ollama_roots():
        manifests = root / "manifests"
        if not manifests.is_dir():
            continue
        for manifest in sorted(manifests.glob("*/*/*/*")):
            if manifest.is_dir():
                continue
            if not manifest.is_file():  # a FIFO, a link to a device: never opened
                log.info("skipping Ollama manifest %s (not a regular file)", manifest)
                continue
            blob = ollama_blob(root, manifest)
            if blob is not None:
                tag, model, namespace, host = manifest.name, manifest.parent.name, manifest.parent.parent.name, \
                    manifest.parent.parent.parent.name
                found.append(Found(ollama_name(host, namespace, model, tag), blob, "ollama"))
    return found


def discover() -> list[Found]:
    """Every model file the three apps hold, in a stable order (LM Studio, llama.cpp, Ollama)."""
    found = []
    for finder in (find_lmstudio, find_llama_cpp, find_ollama):
        try:
            found.extend(finder())
        except OSError as exc:  # an unreadable folder hides its models, not everyone's
            log.warning("could not look through %s's models (%s)", finder.__name__.removeprefix("find_"), exc)
    return found
