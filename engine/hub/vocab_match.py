"""Does a drafter share its target's tokenizer? Checked on the downloaded tokenizer files, before
the weights are fetched.

A draft model proposes token ids that the target verifies; that is only meaningful if both map
ids to the same strings. (Vocabulary *size* alone is not the test: Qwen2.5-7B pads its embedding
to 152,064 rows while its 0.5B drafter has 151,936, with one tokenizer.) Reads JSON only -- no
transformers import -- so it is cheap enough to run on the download worker.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class VocabCheck:
    same: bool
    reason: str


def _from_tokenizer_json(path: Path) -> dict[str, int]:
    data = json.loads(path.read_text(encoding="utf-8"))
    vocab = (data.get("model") or {}).get("vocab") or {}
    if isinstance(vocab, list):  # Unigram: [[piece, score], ...] in id order
        mapping = {piece: i for i, (piece, *_rest) in enumerate(vocab)}
    else:
        mapping = dict(vocab)
    for added in data.get("added_tokens") or []:
        mapping[added["content"]] = added["id"]
    return mapping


def _from_vocab_json(folder: Path) -> dict[str, int]:
    mapping = dict(json.loads((folder / "vocab.json").read_text(encoding="utf-8")))
    added = folder / "added_tokens.json"
    if added.exists():
        mapping.update(json.loads(added.read_text(encoding="utf-8")))
    return mapping


def vocabulary(folder: Path) -> dict[str, int] | str | None:
    """token -> id from a model folder's tokenizer files; for a SentencePiece-only tokenizer a
    digest of its model file stands in; None when the folder has no tokenizer."""
    folder = Path(folder)
    if (folder / "tokenizer.json").exists():
        return _from_tokenizer_json(folder / "tokenizer.json")
    if (folder / "vocab.json").exists():
        return _from_vocab_json(folder)
    for name in ("tokenizer.model", "spiece.model"):
        if (folder / name).exists():
            return "sentencepiece:" + hashlib.sha256((folder / name).read_bytes()).hexdigest()
    return None


def config_vocab_size(folder: Path) -> int | None:
    try:
        config = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")


def _show(mapping: dict[str, int]) -> dict[int, str]:
    return {i: t for t, i in mapping.items()}


def compare(target_dir: Path, drafter_dir: Path, target_name: str = "target", drafter_name: str = "drafter") -> VocabCheck:
    t, d = vocabulary(target_dir), vocabulary(drafter_dir)
    if t is None or d is None:
        # Some drafters (assistant / EAGLE heads) ship no tokenizer: fall back to the one number
        # both configs carry.
        ts, ds = config_vocab_size(target_dir), config_vocab_size(drafter_dir)
        if ts is not None and ts == ds:
            return VocabCheck(True, f"{drafter_name} ships no tokenizer; its vocab size matches ({ts:,})")
        return VocabCheck(False, f"{drafter_name} and {target_name} cannot be shown to share a tokenizer"
                                 f" (vocab sizes {ds} vs {ts})")
    if t == d:
        return VocabCheck(True, "same tokenizer vocabulary")
    if isinstance(t, str) or isinstance(d, str):
        return VocabCheck(False, f"{drafter_name} uses a different tokenizer model from {target_name}")
    by_id_t, by_id_d = _show(t), _show(d)
    differing = [i for i in sorted(set(by_id_t) | set(by_id_d)) if by_id_t.get(i) != by_id_d.get(i)]
    examples = "; ".join(f"id {i}: {by_id_t.get(i)!r} vs {by_id_d.get(i)!r}" for i in differing[:3])
    return VocabCheck(
        False,
        f"{drafter_name} has a different tokenizer from {target_name}: {len(d):,} vs {len(t):,} tokens,"
        f" {len(differing):,} ids map to different strings ({examples})",
    )
