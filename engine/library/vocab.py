"""Vocabularies as token lists: a fingerprint to match on, a store to explain a mismatch.

A draft model's ids mean something to its target only when both map every id to the same
string (engine.session checks ``get_vocab()`` equality when it loads a pair). The same test
is run here on the token lists themselves, before anything is loaded: a GGUF file's
``tokenizer.ggml.tokens`` (in id order) or a model folder's ``tokenizer.json`` (vocab plus
added tokens, by id) -- the idea of engine.hub.vocab_match, applied to GGUF metadata.

The fingerprint is a digest of the list, so equal fingerprints mean equal lists. Lists are
kept once per fingerprint under Tandem's cache dir (several quantizations of one model share
one), so saying *where* two vocabularies part ("differs at token id 151,643") needs no header
read at listing time.
"""
from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from engine.core.paths import cache_dir
from engine.library.store import read_json, write_json_atomic

log = logging.getLogger(__name__)


def fingerprint(tokens: list[str]) -> str:
    """A digest of the token list (order and strings): "vocab-<32 hex>"."""
    digest = hashlib.sha256()
    for token in tokens:
        data = token.encode("utf-8", errors="surrogateescape")
        digest.update(len(data).to_bytes(4, "little"))
        digest.update(data)
    return "vocab-" + digest.hexdigest()[:32]


def store_dir() -> Path:
    return cache_dir() / "library" / "vocab"


def remember(tokens: list[str]) -> str:
    """Keep ``tokens`` in the store (once per fingerprint); returns the fingerprint."""
    key = fingerprint(tokens)
    path = store_dir() / f"{key}.json"
    if not path.exists():
        try:
            write_json_atomic(path, tokens)
        except OSError as exc:  # a read-only cache: matching still works, its reasons say less
            log.warning("could not keep the vocabulary %s (%s)", key, exc)
    return key


def recall(key: str) -> list[str] | None:
    """The token list with fingerprint ``key``, if the store holds it."""
    tokens = read_json(store_dir() / f"{key}.json")
    return tokens if isinstance(tokens, list) else None


def tokens_of_folder(folder: Path) -> list[str] | None:
    """A model folder's tokens in id order, from its tokenizer.json (None without one). An id no
    token maps to (a gap) reads as "" so the list stays aligned with the ids."""
    path = Path(folder) / "tokenizer.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    vocab = (data.get("model") or {}).get("vocab") or {}
    if isinstance(vocab, list):  # Unigram: [[piece, score], ...] in id order
        by_id = {i: entry[0] for i, entry in enumerate(vocab)}
    else:
        by_id = {int(i): t for t, i in vocab.items()}
    for added in data.get("added_tokens") or []:
        by_id[int(added["id"])] = added["content"]
    if not by_id:
        return None
    return [by_id.get(i, "") for i in range(max(by_id) + 1)]


@dataclass(frozen=True)
class Difference:
    """Where two token lists part: the first id whose strings differ (or that one list lacks)."""

    token_id: int
    ours: str | None
    theirs: str | None

    def describe(self) -> str:
        if self.ours is None or self.theirs is None:
            return f"differs at token id {self.token_id:,} (one vocabulary ends there)"
        return f"differs at token id {self.token_id:,} ({self.ours!r} vs {self.theirs!r})"


def first_difference(ours: list[str], theirs: list[str]) -> Difference | None:
    """None when the lists are equal."""
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            return Difference(i, a, b)
    if len(ours) == len(theirs):
        return None
    n = min(len(ours), len(theirs))
    return Difference(n, ours[n] if n < len(ours) else None, theirs[n] if n < len(theirs) else None)
