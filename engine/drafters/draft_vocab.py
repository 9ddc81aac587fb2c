"""Which tokens a reduced drafter head keeps: chosen once per tokenizer from data, then cached.

A drafter's LM head scores every vocabulary token at every draft step, yet the text a target
writes uses a small part of a 150k-token vocabulary (most of the rest is other scripts and rare
words). The subset, in priority order:
  1. every special / added token (end of turn, chat markers: the target emits them),
  2. the tokens of a calibration set of conversations shipped in resources/ (code in several
     languages, rewriting, prose, math, chat), most frequent first,
  3. then the tokenizer's own frequency prior: byte-level BPE assigns ids in merge order and
     early merges are the pairs that were most frequent in the tokenizer's training corpus.
At run time the drafter adds the tokens of the request's own context (engine.drafters.
reduced_head), so identifiers a prompt introduces stay proposable. Which tokens are kept never
affects what the target accepts, only how often drafts agree with it.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from collections import Counter
from pathlib import Path

from engine.core.paths import RESOURCES, cache_dir
from engine.core.settings import DEFAULT_DRAFT_VOCAB

log = logging.getLogger(__name__)

CALIBRATION = RESOURCES / "calibration" / "conversations.jsonl"
_VERSION = 1  # bump when the selection rule changes, so cached subsets are rebuilt


def read_conversations(path: Path = CALIBRATION) -> list[list[dict]]:
    """One {"category", "messages": [{"role", "content"}, ...]} per line."""
    conversations = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if line.strip():
            item = json.loads(line)
            if not item.get("messages"):
                raise ValueError(f"{path}:{n}: no messages")
            conversations.append(item["messages"])
    return conversations


def _encode(tokenizer, messages: list[dict]) -> list[int]:
    # Through the chat template when there is one: the template's own tokens are what a chat
    # drafter sees and emits most often.
    if getattr(tokenizer, "chat_template", None):
        encoded = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)
        return list(encoded["input_ids"])
    return tokenizer("\n".join(m["content"] for m in messages))["input_ids"]


def special_ids(tokenizer) -> set[int]:
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    ids.update(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is not None:
        ids.add(eos)
    return ids


def choose_subset(tokenizer, size: int, conversations: list[list[dict]]) -> list[int]:
    """Sorted ids of at most ``size`` tokens (more only if the special tokens alone exceed it)."""
    vocab_size = len(tokenizer)
    chosen = dict.fromkeys(sorted(i for i in special_ids(tokenizer) if i < vocab_size))
    counts = Counter(t for messages in conversations for t in _encode(tokenizer, messages))
    for token, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if len(chosen) >= size:
            break
        chosen.setdefault(token)
    for token in range(vocab_size):
        if len(chosen) >= size:
            break
        chosen.setdefault(token)
    return sorted(chosen)


def tokenizer_fingerprint(tokenizer) -> str:
    """Changes whenever tokenization could: vocabulary, merges, normalization, added tokens."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else json.dumps(sorted(tokenizer.get_vocab().items()))
    template = getattr(tokenizer, "chat_template", None) or ""
    return hashlib.sha256((text + "\0" + str(template)).encode()).hexdigest()


def load_subset(tokenizer, size: int = DEFAULT_DRAFT_VOCAB, corpus: Path = CALIBRATION) -> list[int]:
    """The subset for this tokenizer, computed once and cached in the user cache dir."""
    corpus = Path(corpus)
    key = hashlib.sha256(
        f"{_VERSION}\0{size}\0{tokenizer_fingerprint(tokenizer)}\0".encode() + corpus.read_bytes()
    ).hexdigest()[:20]
    path = cache_dir() / "draft_vocab" / f"{key}.json"
    if path.exists():
        try:
            return json.loads(path.read_text())["ids"]
        except (ValueError, KeyError):
            log.warning("ignoring unreadable cached token subset %s", path)
    ids = choose_subset(tokenizer, size, read_conversations(corpus))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"size": size, "corpus": corpus.name, "ids": ids}))
    os.replace(tmp, path)  # atomic: a concurrent reader sees the old state or the whole file
    log.info("draft vocabulary: %d tokens, cached in %s", len(ids), path)
    return ids
