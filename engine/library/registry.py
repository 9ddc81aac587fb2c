"""GGUF files registered with ``tandem import``: kept where they are, listed by Tandem.

The registry is one JSON file in Tandem's data dir (``library.json``): per model its path,
its parts, every part's size and mtime at import, and its header summary. Nothing is copied.
Every change is made under the registry's lock (``library.json.lock``, engine.library.store):
the file is read, changed and rewritten whole and atomically while it is held, so two
``tandem import`` at once both land (neither reads the registry before the other's write and
then writes over it), and an import interrupted by an exception, a kill or a power cut leaves
the previous registry as it was. Headers are read before the lock is taken: it is held for
milliseconds.

Importing reads the header (engine.library.header) and refuses, with one line naming the file
and the reason, what Tandem could not run: not a GGUF file, truncated or corrupt (metadata
nested past reading, a tensor with a 0-length dimension), a split model with a part missing
or a split name that cannot be, an architecture or tensor type the engine lacks, no tokenizer.
Importing a file again replaces its entry (idempotent). At listing time each entry is checked
against the disk and listed as it is now: a changed file is read again (its entry updated when
it still imports), and a file that has vanished or no longer reads is listed with ``problem``
saying so. Such an entry stays registered (the file may be on a drive not mounted now, or
mended later) until ``tandem import --forget PATH``.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from engine.core.paths import data_dir
from engine.gguf.reader import SPLIT_NAME, GgufError
from engine.library.header import check_regular_file, model_parts, one_line
from engine.library.local_model import LocalModel, Summary
from engine.library.store import locked, read_json, write_json_atomic
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
        parts = tuple(Path(p) for p in data["parts"])
        if not parts or not all(isinstance(p, str) for p in data["parts"]):
            raise ValueError("an entry without its files")
        return cls(str(data["name"]), parts, list(data["stamps"]), Summary.from_json(data["summary"]),
                   str(data.get("imported_at", "")))

    def model(self, summary: Summary | None = None, problem: str | None = None) -> LocalModel:
        """The entry as listed: with ``summary`` (as read now), or marked with ``problem``."""
        size = sum(int(s[1]) for s in self.stamps if isinstance(s, list) and len(s) > 1 and isinstance(s[1], int))
        if problem is not None:
            summary = Summary(None, None, None, (), None, None, None, None, problem)
        return LocalModel(self.name, self.parts[0], self.parts, "imported", size, summary or self.summary)


def _load() -> list[_Entry]:
    data = read_json(registry_path())
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        if registry_path().exists():
            log.warning("%s is unreadable; starting an empty registry (the file is set aside on the next import)",
                        registry_path())
        return []
    entries = []
    for item in data.get("models") if isinstance(data.get("models"), list) else []:
        try:
            entries.append(_Entry.from_json(item))
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("skipping an unreadable registry entry (%s)", exc)
    return entries


def _change(change) -> list[_Entry]:
    """Apply ``change`` (entries -> entries) to the registry under its lock; the entries written."""
    path = registry_path()
    with locked(path):
        entries = _load()
        if not entries and path.exists() and not isinstance(read_json(path), dict):
            aside = path.with_name(f"{path.name}.unreadable")  # kept for a person to look at, never read
            try:
                os.replace(path, aside)
                log.warning("set the unreadable registry aside as %s", aside)
            except OSError as exc:
                log.warning("could not set the unreadable registry %s aside (%s)", path, exc)
        new = change(entries)
        write_json_atomic(path, {"format": FORMAT, "models": [e.to_json() for e in new]})
        return new


def _check(path: Path, cache: SummaryCache) -> tuple[tuple[Path, ...], Summary]:
    """(parts, summary) of an importable file; GgufError (one line, naming it) otherwise."""
    if not path.exists():
        raise GgufError(f"{path} does not exist")
    if path.is_dir():
        raise GgufError(f"{path} is a folder; import a .gguf file (any part of a split model)")
    check_regular_file(path)
    parts = model_parts(path)
    summary = cache.gguf(parts)
    if summary.problem:
        raise GgufError(summary.problem)
    return parts, summary


def import_model(path: Path | str) -> LocalModel:
    """Register the GGUF model at ``path`` (a file, or any part of a split model) without
    copying it; the registered model. Raises ``GgufError`` saying why the file cannot be used
    (OSError where the registry cannot be written)."""
    path = Path(path).expanduser().absolute()
    cache = SummaryCache()
    try:
        parts, summary = _check(path, cache)
    finally:
        cache.save()
    entry = _Entry(model_name(parts[0]), parts, stamps(parts), summary,
                   datetime.now(timezone.utc).isoformat(timespec="seconds"))
    _change(lambda entries: [*(e for e in entries if e.parts[0] != parts[0]), entry])
    log.info("registered %s (%s, %s)", parts[0], summary.architecture, summary.quant)
    return entry.model()


def forget(path: Path | str) -> bool:
    """Unregister the model whose file (any part) is ``path``; False if it was not registered.
    The file itself is left alone."""
    path = Path(path).expanduser().absolute()
    if not any(path in e.parts for e in _load()):
        return False
    _change(lambda entries: [e for e in entries if path not in e.parts])
    return True


def _as_now(entry: _Entry, cache: SummaryCache) -> tuple[LocalModel, _Entry | None]:
    """``entry`` as its files are now: (the listed model, the entry to write back where the
    files changed and still import, else None). Never raises for what the files hold."""
    try:
        missing = [p for p in entry.parts if not p.exists()]
        if missing:
            gone = "is missing" if len(missing) == 1 else f"and {len(missing) - 1} more parts are missing"
            return entry.model(problem=f"{missing[0]} {gone} (registered with tandem import; "
                                       f"'tandem import --forget {entry.parts[0]}' unregisters it)"), None
        if stamps(entry.parts) == entry.stamps:
            return entry.model(cache.gguf(entry.parts)), None  # the cache's copy: read with today's checks
        parts, summary = _check(entry.parts[0], cache)
    except (GgufError, OSError) as exc:
        return entry.model(problem=str(exc)), None
    except Exception as exc:  # noqa: BLE001 -- one entry never ends the listing of the others
        log.warning("cannot read the registered %s", entry.parts[0], exc_info=True)
        return entry.model(problem=f"{entry.parts[0].name} cannot be read ({one_line(exc)})"), None
    updated = _Entry(entry.name, parts, stamps(parts), summary, entry.imported_at)
    return updated.model(), updated


def imported_models(cache: SummaryCache | None = None) -> list[LocalModel]:
    """The registered models as they are on disk now: changed ones read again (and their
    entries updated when they still import); vanished or unreadable ones listed with
    ``problem`` saying why, and kept registered."""
    cache = cache or SummaryCache()
    listed, updates = [], {}
    for entry in _load():
        model, updated = _as_now(entry, cache)
        listed.append(model)
        if updated is not None:
            updates[entry.parts[0]] = (entry.stamps, updated)

    def apply(entries: list[_Entry]) -> list[_Entry]:
        # Only entries still as they were read: one re-imported meanwhile is that import's.
        return [updates[e.parts[0]][1] if e.parts[0] in updates and e.stamps == updates[e.parts[0]][0] else e
                for e in entries]

    if updates:
        try:
            _change(apply)
        except OSError as exc:
            log.warning("could not update the registry %s (%s)", registry_path(), exc)
    return listed
