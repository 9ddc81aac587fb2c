"""Every local GGUF model in one list: imported ones, then LM Studio's, llama.cpp's and Ollama's,
each with its drafter (or the reason prompt lookup drafts instead).

Headers are read only for files new or changed since the last listing (engine.library.summaries);
the registry is brought up to date with the disk on the way (engine.library.registry). A file
reachable twice (imported from LM Studio's folder, two Ollama tags of one blob) is listed once,
first where it was first met.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
from pathlib import Path

from engine.core.paths import cache_dir
from engine.gguf.reader import GgufError, is_gguf
from engine.library.discovery import Found, discover
from engine.library.drafter_match import match_all
from engine.library.header import model_parts, one_line
from engine.library.local_model import DrafterCandidate, LocalModel, Summary
from engine.library.registry import imported_models, model_name
from engine.library.summaries import SummaryCache

log = logging.getLogger(__name__)


def list_local_models(with_drafters: bool = True) -> list[LocalModel]:
    """The local GGUF models, each with ``drafting`` filled in (unless ``with_drafters`` is
    False). Models Tandem cannot run are listed too, with ``problem`` saying why."""
    cache = SummaryCache()
    try:
        models = _unique([*imported_models(cache), *_discovered(cache)])
        if with_drafters:
            # A file that could not be read at all drafts for nothing, and is no reason either.
            readable = [m.as_candidate() for m in models if m.architecture is not None or m.vocab_fingerprint is not None]
            models = match_all(models, [*readable, *tandem_candidates(cache)])
        return models
    finally:
        cache.save()


def _discovered(cache: SummaryCache) -> list[LocalModel]:
    models = []
    for found in discover():
        try:
            models.append(_read_found(found, cache))
        except Exception as exc:  # noqa: BLE001 -- one file never ends the listing of the others
            log.warning("cannot read %s (%s)", found.path, one_line(exc), exc_info=True)
            models.append(_unreadable(found.name, found.path, found.source,
                                      f"{found.name} cannot be read ({one_line(exc)})"))
    return models


def _read_found(found: Found, cache: SummaryCache) -> LocalModel:
    """``found`` as a listed model: its summary, or its ``problem`` where it cannot be read."""
    display = found.name if found.source == "ollama" else None  # a blob's file name says nothing
    try:
        parts = model_parts(found.path)
        size = sum(p.stat().st_size for p in parts)
    except (GgufError, OSError) as exc:
        return _unreadable(found.name, found.path, found.source, str(exc), _size(found.path))
    try:
        summary = cache.gguf(parts, display)
    except (GgufError, OSError) as exc:
        return _unreadable(found.name, found.path, found.source, str(exc), size)
    return LocalModel(found.name, parts[0], parts, found.source, size, summary)


def _unreadable(name: str, path: Path, source, problem: str, size: int = 0) -> LocalModel:
    return LocalModel(name, path, (path,), source, size, Summary(None, None, None, (), None, None, None, None, problem))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _unique(models: list[LocalModel]) -> list[LocalModel]:
    seen, out = set(), []
    for m in models:
        try:
            key = m.path.resolve()
        except (OSError, RuntimeError):  # RuntimeError: a symlink loop
            key = m.path
        if key not in seen:
            seen.add(key)
            out.append(m)
    return out


def tandem_candidates(cache: SummaryCache) -> list[DrafterCandidate]:
    """Tandem's own models that can draft: folders it converted (``<cache>/models/<name>``,
    complete once their ``tandem-converted.json`` is written) and GGUF files it fetched
    (``<cache>/gguf``)."""
    out = []
    root = cache_dir()
    for folder in sorted((root / "models").glob("*/tandem-converted.json")):
        folder = folder.parent
        if not (folder / "tokenizer.json").exists() or not any(folder.glob("*.safetensors")):
            continue
        try:
            s = cache.folder(folder)
            size = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
        except Exception as exc:  # noqa: BLE001 -- a damaged folder is not a drafter; the listing goes on
            log.info("skipping %s as a drafter (%s)", folder, one_line(exc))
            continue
        out.append(DrafterCandidate(folder.name, folder, "tandem", "folder", size, s.architecture, s.parameter_count,
                                    s.vocab_fingerprint, s.problem))
    for path in sorted((root / "gguf").glob("*.gguf")):
        try:
            parts = model_parts(path)
            s = cache.gguf(parts)
            size = sum(p.stat().st_size for p in parts)
        except Exception as exc:  # noqa: BLE001 -- GgufError, OSError, or worse: not a drafter, either way
            log.info("skipping %s as a drafter (%s)", path, one_line(exc))
            continue
        out.append(DrafterCandidate(model_name(path), path, "tandem", "gguf", size,
                                    s.architecture, s.parameter_count, s.vocab_fingerprint, s.problem))
    return out


def find_local_model(path: Path | str, models: list[LocalModel] | None = None) -> LocalModel | None:
    """The listed model whose file (any part) is ``path``."""
    path = Path(path).expanduser().absolute()
    for m in models if models is not None else list_local_models():
        if path in m.parts or _resolved(m.path) == _resolved(path):
            return m
    return None


def _resolved(path: Path) -> Path:
    try:
        return path.resolve()
    except (OSError, RuntimeError):
        return path


def loadable_path(item: LocalModel | DrafterCandidate) -> Path:
    """A path Session.load takes for ``item``: its own, or for a GGUF file without the .gguf
    name (an Ollama blob) a link to it under Tandem's cache dir (the blob's folder is Ollama's
    and stays untouched)."""
    path = item.path
    if is_gguf(path) or path.is_dir():
        return path
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", item.name).strip("-.") or "model"
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
    link = cache_dir() / "library" / "links" / f"{safe}-{digest}.gguf"
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() and Path(os.readlink(link)) == path.resolve():
        return link
    tmp = link.with_name(link.name + ".tmp")
    tmp.unlink(missing_ok=True)
    try:
        tmp.symlink_to(path.resolve())
    except OSError:  # no symlinks here (Windows without the privilege): a hard link, same volume only
        os.link(path.resolve(), tmp)
    os.replace(tmp, link)
    return link
