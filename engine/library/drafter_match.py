"""Which installed model drafts for a target, or why none does (then prompt lookup drafts).

A candidate drafts for a target when (checked in this order, the first failure is its reason):

1. it has the same vocabulary: the same token list, id for id (engine.library.vocab; equal
   fingerprints). Otherwise the reason names the first id where the lists part.
2. Tandem can run it (its architecture and tensor types are ones the engine builds).
3. it is smaller than the target (fewer parameters): a drafter pays only while its step costs
   a fraction of the target's.

Of the candidates that pass, the one with the fewest parameters is chosen (on these machines
the draft step's cost is what limits the speedup), a GGUF file before a converted folder of
the same size (it runs natively next to a GGUF target). Refusals are data for the picker.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from engine.library import vocab
from engine.library.local_model import (
    DrafterCandidate,
    DrafterRefusal,
    Drafting,
    LocalModel,
)

log = logging.getLogger(__name__)


class _Tokens:
    """Token lists by fingerprint, read once per matching run (store first, then the file)."""

    def __init__(self) -> None:
        self._lists: dict[str, list[str] | None] = {}

    def get(self, fingerprint: str | None, path: Path, kind: str) -> list[str] | None:
        if fingerprint is None:
            return None
        if fingerprint not in self._lists:
            tokens = vocab.recall(fingerprint)
            if tokens is None:
                tokens = _read_tokens(path, kind)
            self._lists[fingerprint] = tokens
        return self._lists[fingerprint]


def _read_tokens(path: Path, kind: str) -> list[str] | None:
    from engine.gguf.reader import GgufError
    from engine.library.header import read_header

    if kind == "folder":
        return vocab.tokens_of_folder(path)
    try:
        return read_header(path).tokens
    except (GgufError, OSError) as exc:
        log.info("could not read the vocabulary of %s (%s)", path, exc)
        return None


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return a == b


def _smaller(candidate: DrafterCandidate, target: LocalModel) -> bool:
    if candidate.parameter_count and target.parameter_count:
        return candidate.parameter_count < target.parameter_count
    return candidate.file_bytes < target.file_bytes


def _size_words(candidate: DrafterCandidate, target: LocalModel) -> str:
    if candidate.parameter_count and target.parameter_count:
        return f"{candidate.parameter_count:,} parameters, the target {target.parameter_count:,}"
    return f"{candidate.file_bytes:,} bytes, the target {target.file_bytes:,}"


def _refuse(target: LocalModel, candidate: DrafterCandidate, tokens: _Tokens) -> DrafterRefusal | None:
    if candidate.vocab_fingerprint is None or candidate.vocab_fingerprint != target.vocab_fingerprint:
        ours = tokens.get(target.vocab_fingerprint, target.path, "gguf")
        theirs = tokens.get(candidate.vocab_fingerprint, candidate.path, candidate.kind)
        difference = vocab.first_difference(ours, theirs) if ours is not None and theirs is not None else None
        if difference is None:
            return DrafterRefusal(candidate, "vocabulary", f"{candidate.name} has no readable vocabulary to compare")
        return DrafterRefusal(candidate, "vocabulary", f"{candidate.name} {difference.describe()}", difference.token_id)
    if candidate.problem is not None:
        from engine.gguf.model import SUPPORTED_ARCHITECTURES

        if candidate.architecture not in SUPPORTED_ARCHITECTURES:
            return DrafterRefusal(candidate, "architecture",
                                  f"architecture {candidate.architecture} cannot run as a drafter ({candidate.name})")
        return DrafterRefusal(candidate, "architecture", f"{candidate.name} cannot run as a drafter: {candidate.problem}")
    if not _smaller(candidate, target):
        as_large = ("the same size as the target (another copy of the model?)"
                    if (candidate.parameter_count or candidate.file_bytes) == (target.parameter_count or target.file_bytes)
                    else "larger than target")
        return DrafterRefusal(candidate, "larger", f"drafter {as_large}: {candidate.name} has {_size_words(candidate, target)}")
    return None


def match_drafter(target: LocalModel, candidates: Sequence[DrafterCandidate], tokens: _Tokens | None = None) -> Drafting:
    """How ``target`` will be drafted for, given the installed ``candidates``."""
    tokens = tokens or _Tokens()
    others = [c for c in candidates if not _same_file(c.path, target.path)]
    refusals, eligible = [], []
    for candidate in others:
        refusal = _refuse(target, candidate, tokens)
        (refusals if refusal else eligible).append(refusal or candidate)
    if eligible:
        best = min(eligible, key=lambda c: (c.parameter_count or c.file_bytes, c.kind != "gguf", c.name))
        ratio = (target.parameter_count / best.parameter_count
                 if best.parameter_count and target.parameter_count else target.file_bytes / max(best.file_bytes, 1))
        return Drafting("model", best, f"{best.name} shares the vocabulary and is {ratio:.1f}x smaller", tuple(refusals))
    return Drafting("lookup", None, _lookup_reason(refusals), tuple(refusals))


def _lookup_reason(refusals: list[DrafterRefusal]) -> str:
    if not refusals:
        return "no drafter is installed"
    for why in ("larger", "architecture"):  # a drafter of this vocabulary exists: say what stops it
        same_vocab = [r for r in refusals if r.why == why]
        if same_vocab:
            return same_vocab[0].message
    closest = max(refusals, key=lambda r: -1 if r.token_id is None else r.token_id)
    return f"no installed drafter shares this vocabulary: {closest.message}"


def match_all(models: Sequence[LocalModel], candidates: Sequence[DrafterCandidate]) -> list[LocalModel]:
    """``models`` with ``drafting`` filled in (left None for the ones Tandem cannot run)."""
    from dataclasses import replace

    tokens = _Tokens()
    out = []
    for m in models:
        if not m.runnable:
            out.append(m)
            continue
        try:
            drafting = match_drafter(m, candidates, tokens)
        except Exception as exc:  # noqa: BLE001 -- a candidate's damaged file costs this model its drafter, no more
            log.warning("could not match a drafter for %s", m.path, exc_info=True)
            drafting = Drafting("lookup", None, f"the drafters could not be compared ({type(exc).__name__}: {exc})"[:300])
        out.append(replace(m, drafting=drafting))
    return out
