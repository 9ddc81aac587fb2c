"""GGUF files registered with ``tandem import``: kept where they are, listed by Tandem.

The registry is one JSON file in Tandem's data dir (``library.json``): per model its path,
its parts, every part's size and mtime at import, and its header summary. Nothing is copied.
Every change rewrites the file whole and atomically (engine.library.store), so an import
interrupted by an exception, a kill or a power cut leaves the previous registry as it was.

Importing reads the header (engine.library.header) and refuses, with one line naming the file
and the reason, what Tandem could not run: not a GGUF file, truncated or corrupt, a split
model with a part missing, an architecture or tensor type the engine lacks, no tokenizer.
Importing a file again replaces its entry (idempotent). At listing time each entry is checked
against the disk: a vanished file is dropped, a changed one read again (and dropped if it no
longer imports). Two processes writing at once do not corrupt it either: each write is whole,
and the last one wins.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from engine.core.paths import data_dir
from engine.gguf.reader import SPLIT_NAME, GgufError, split_parts
from engine.library.local_model import LocalModel, Summary
from engine.library.store import read_json, write_json_atomic
from engine.library.summaries import SummaryCache, stamps

log = logging.getLogger(__name__)

FORMAT = 1


def registry_path() -> Path:
    return data_dir() / "library.json"


def model_name(first_part: Path) -> str:
    """A file's model name: its file name without ``.gguf`` and without a split suffix."""
    match = SPLIT_NAME.match(first_part.name)
    stem = match["stem"] if match else first_part.name
    return stem[:-5] if stem.lower().endswith(".gguf") else stem


@dataclass(frozen=True)
class _Entry:
    name: str
    parts: tuple[Path, ...]
    stamps: list
    summary: Summary
    imported_at: str

    def to_json(self) -> dict:
        return {"name": self.name, "path": str(self.parts[0]), "parts": [str(p) for p in self.parts],
                "stamps": self.stamps, "summary": self.summary.to_json(), "imported_at": self.imported_at}

    @classmethod
    def from_json(cls, data: dict) -> _Entry:
        return cls(str(data["name"]), tuple(Path(p) for p in data["parts"]), list(data["stamps"]),
                   Summary.from_json(data["summary"]), str(data.get("imported_at", "")))

    def model(self) -> LocalModel:
        size = sum(int(s[1]) for s in self.stamps)
        return LocalModel(self.name, self.parts[0], self.parts, "imported", size, self.summary)


def _load() -> list[_Entry]:
    data = read_json(registry_path())
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        if registry_path().exists():
            log.warning("%s is unreadable; starting an empty registry (the file is replaced on the next import)",
                        registry_path())
        return []
    entries = []
    for item in data.get("models") or []:
        try:
            entries.append(_Entry.from_json(item))
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("skipping an unreadable registry entry (%s)", exc)
    return entries


def _save(entries: list[_Entry]) -> None:
    write_json_atomic(registry_path(), {"format": FORMAT, "models": [e.to_json() for e in entries]})


def _check(path: Path, cache: SummaryCache) -> tuple[tuple[Path, ...], Summary]:
    """(parts, summary) of an importable file; GgufError (one line, naming it) otherwise."""
    if not path.exists():
        raise GgufError(f"{path} does not exist")
    if path.is_dir():
        raise GgufError(f"{path} is a folder; import a .gguf file (any part of a split model)")
    parts = split_parts(path)
    summary = cache.gguf(parts)
    if summary.problem:
        raise GgufError(summary.problem)
    return parts, summary


def import_model(path: Path | str) -> LocalModel:
    """Register the GGUF model at ``path`` (a file, or any part of a split model) without
    copying it; the registered model. Raises ``GgufError`` saying why the file cannot be used."""
    path = Path(path).expanduser().absolute()
    cache = SummaryCache()
    try:
        parts, summary = _check(path, cache)
    finally:
        cache.save()
    entry = _Entry(model_name(parts[0]), parts, stamps(parts), summary,
                   datetime.now(timezone.utc).isoformat(timespec="seconds"))
    entries = [e for e in _load() if e.parts[0] != parts[0]]
    _save([*entries, entry])
    log.info("registered %s (%s, %s)", parts[0], summary.architecture, summary.quant)
    return entry.model()


def forget(path: Path | str) -> bool:
    """Unregister the model whose file (any part) is ``path``; False if it was not registered.
    The file itself is left alone."""
    path = Path(path).expanduser().absolute()
    entries = _load()
    kept = [e for e in entries if path not in e.parts]
    if len(kept) == len(entries):
        return False
    _save(kept)
    return True


def imported_models(cache: SummaryCache | None = None) -> list[LocalModel]:
    """The registered models as they are on disk now: vanished files dropped from the
    registry, changed ones read again (and dropped if they no longer import)."""
    cache = cache or SummaryCache()
    entries, current, changed = _load(), [], False
    for entry in entries:
        if not all(p.exists() for p in entry.parts):
            log.info("%s is gone; dropping it from the registry", entry.parts[0])
            changed = True
            continue
        try:
            now = stamps(entry.parts)
        except OSError:
            changed = True
            continue
        if now == entry.stamps:
            current.append(entry)
            continue
        changed = True
        try:
            parts, summary = _check(entry.parts[0], cache)
        except GgufError as exc:
            log.warning("%s changed and no longer imports (%s); dropping it from the registry", entry.parts[0], exc)
            continue
        current.append(_Entry(entry.name, parts, stamps(parts), summary, entry.imported_at))
    if changed:
        try:
            _save(current)
        except OSError as exc:
            log.warning("could not update the registry %s (%s)", registry_path(), exc)
    return [e.model() for e in current]
