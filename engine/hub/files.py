"""Which files of a Hub repo Tandem needs, and where a drafter may sit inside a repo.

Pure functions over a repo's file listing (as the Hub's model-info endpoint reports it), so the
rules are testable without a server. The listing is checked as it is read
(``files_from_listing``): its names become paths in the cache. Only what loading needs is fetched: config, generation
config, tokenizer, and one set of weights -- safetensors when the repo has them, other formats
(PyTorch .bin, GGUF) only when that is all there is. Repos often carry several copies of the
weights (ONNX, GGUF quantizations, "original/" checkpoints); fetching them all would multiply
the download.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from engine.hub.safe_names import (
    GIT_SHA1,
    SHA256,
    UnsafeName,
    blob_hash,
    repo_file_path,
)

CONFIG_FILES = frozenset({"config.json", "generation_config.json"})
TOKENIZER_FILES = frozenset({
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "merges.txt", "vocab.txt", "tokenizer.model", "spiece.model",
    "chat_template.jinja", "chat_template.json",
})
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf")

# Folders inside a target repo that hold a drafter for it, and the drafter kind each implies.
# (MTP heads stored inside the main checkpoint are part of the target and need nothing extra.)
SIDECAR_DIRS = {
    "assistant": "assistant",
    "draft": "draft_model",
    "drafter": "draft_model",
    "mtp": "mtp",
    "eagle": "mtp",
    "eagle3": "mtp",
    "dflash": "mtp",
}

# Precision names that mean "the repo's own weights": the engine casts at load time.
DEFAULT_PRECISIONS = frozenset({"", "default", "auto", "exact", "fast"})

_PLAIN_SAFETENSORS = re.compile(r"^[^.]+\.safetensors$")  # model.safetensors, model-00001-of-00002.safetensors
_PLAIN_INDEX = re.compile(r"^[^.]+\.safetensors\.index\.json$")
_VARIANT_SAFETENSORS = re.compile(r"^[^.]+\.(?P<variant>[^.]+?)(?:-\d+-of-\d+)?\.safetensors$")
_BIN_WEIGHTS = re.compile(r"^pytorch_model(?:-\d+-of-\d+)?\.bin$")


@dataclass(frozen=True)
class HubFile:
    """One file of a repo at a commit. The Hub publishes a sha256 for LFS files and the git blob
    id (sha1 of ``b"blob <size>\\0" + content``) for regular ones; either names the blob in
    huggingface_hub's cache, so it doubles as the ETag to expect."""

    path: str
    size: int
    sha256: str | None = None
    git_sha1: str | None = None

    @property
    def etag(self) -> str | None:
        return self.sha256 or self.git_sha1

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    @property
    def is_weights(self) -> bool:
        return self.path.endswith(WEIGHT_SUFFIXES)


class NoUsableWeights(ValueError):
    pass


def byte_count(value: object, repo: str, path: str) -> int:
    """A size the Hub reported, checked; -1 when it reported none."""
    if value is None:
        return -1  # unknown: asked with a HEAD request later
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise UnsafeName(f"{repo}/{path}: the Hub listed {value!r} as its size, which is not a byte count.")


def files_from_listing(siblings, repo: str) -> tuple[HubFile, ...]:
    """A listing's files with every server-supplied name checked: file paths (they name files
    in the snapshot) and hashes (they name blobs). One bad name refuses the whole listing:
    the Hub itself cannot produce one, so the server is broken or hostile."""
    files = []
    for s in siblings:
        path = repo_file_path(s.rfilename, repo)
        if s.lfs is not None:
            sha256 = blob_hash(s.lfs.sha256, repo, path, "LFS sha256", SHA256)
            files.append(HubFile(path, byte_count(s.lfs.size, repo, path), sha256=sha256))
        else:
            blob_id = None if s.blob_id is None else blob_hash(s.blob_id, repo, path, "git blob id", GIT_SHA1)
            files.append(HubFile(path, byte_count(s.size, repo, path), git_sha1=blob_id))
    return tuple(files)


def _in_folder(files: Iterable[HubFile], subfolder: str | None) -> list[HubFile]:
    prefix = f"{subfolder.strip('/')}/" if subfolder else ""
    return [f for f in files if f.path.startswith(prefix) and "/" not in f.path[len(prefix):]]


def _pick_weights(names: dict[str, HubFile], precision: str | None) -> list[str]:
    safetensors = [n for n in names if n.endswith(".safetensors")]
    wanted = (precision or "").strip()
    if safetensors and wanted.lower() not in DEFAULT_PRECISIONS:
        chosen = [n for n in safetensors if (m := _VARIANT_SAFETENSORS.match(n)) and m["variant"] == wanted]
        if not chosen:
            variants = sorted({m["variant"] for n in safetensors if (m := _VARIANT_SAFETENSORS.match(n))})
            raise NoUsableWeights(
                f"no {wanted!r} weights in this repo (variants here: {', '.join(variants) or 'none'};"
                " leave precision unset for the default weights)"
            )
        return chosen + [n for n in names if n.endswith(f".safetensors.index.{wanted}.json")]
    if safetensors:
        plain = [n for n in safetensors if _PLAIN_SAFETENSORS.match(n)]
        if plain:
            return plain + [n for n in names if _PLAIN_INDEX.match(n)]
        # Only variant files (e.g. model.fp16.safetensors): take one variant, not all of them.
        variant = min(m["variant"] for n in safetensors if (m := _VARIANT_SAFETENSORS.match(n)))
        return _pick_weights(names, variant)
    bins = [n for n in names if _BIN_WEIGHTS.match(n)]
    if bins:
        return bins + [n for n in names if n == "pytorch_model.bin.index.json"]
    ggufs = sorted(n for n in names if n.endswith(".gguf"))
    if ggufs:
        if wanted and wanted.lower() not in DEFAULT_PRECISIONS:
            chosen = [n for n in ggufs if wanted.lower() in n.lower()]
        else:
            chosen = ggufs if len(ggufs) == 1 else []
        if chosen:
            return chosen
        raise NoUsableWeights(
            f"this repo has only GGUF files; choose one with a precision naming its quantization"
            f" (files: {', '.join(ggufs)})"
        )
    raise NoUsableWeights("no model weights (.safetensors, .bin or .gguf) in this repo")


def select_files(files: Sequence[HubFile], subfolder: str | None = None, precision: str | None = None) -> tuple[HubFile, ...]:
    """The files to fetch from ``files`` (a repo listing) for the model at the repo root or in
    ``subfolder``: small files first (configs, tokenizer, weight index), then the weights, so a
    tokenizer mismatch is found before the large transfers start."""
    here = _in_folder(files, subfolder)
    names = {f.name: f for f in here}
    if "config.json" not in names:
        where = f"{subfolder}/" if subfolder else "the repo root"
        raise NoUsableWeights(f"no config.json in {where}: not a transformers model folder")
    weights = _pick_weights(names, precision)
    small = [n for n in names if n in CONFIG_FILES or n in TOKENIZER_FILES or (n in weights and not names[n].is_weights)]
    large = [n for n in weights if names[n].is_weights]
    return tuple(names[n] for n in sorted(small)) + tuple(names[n] for n in sorted(large))


def find_sidecar(files: Iterable[HubFile]) -> tuple[str, str] | None:
    """(subfolder, drafter kind) of a drafter stored inside the repo, e.g. ``mtp/`` or
    ``assistant/`` with its own config.json and weights; None when there is none."""
    by_folder: dict[str, set[str]] = {}
    for f in files:
        if f.path.count("/") == 1:
            folder, name = f.path.split("/")
            by_folder.setdefault(folder, set()).add(name)
    for folder, kind in SIDECAR_DIRS.items():
        names = by_folder.get(folder, set())
        if "config.json" in names and any(n.endswith(WEIGHT_SUFFIXES) for n in names):
            return folder, kind
    return None
