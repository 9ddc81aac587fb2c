"""Choosing the reduced head's token subset, and caching it once per tokenizer."""
import json

import pytest

from engine.core.paths import cache_dir
from engine.drafters import draft_vocab
from engine.drafters.draft_vocab import choose_subset, load_subset, read_conversations, special_ids
from engine.testing.tiny_models import build_tokenizer

CONVERSATIONS = [
    [{"role": "user", "content": "print the sum"}, {"role": "assistant", "content": "print(a + b)\nprint(a + b)"}],
    [{"role": "user", "content": "fox"}, {"role": "assistant", "content": "The quick brown fox."}],
]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def corpus_file(path, conversations=CONVERSATIONS):
    path.write_text("".join(json.dumps({"category": "test", "messages": m}) + "\n" for m in conversations))
    return path


def test_subset_has_the_asked_size_and_keeps_special_tokens(tokenizer):
    ids = choose_subset(tokenizer, 60, CONVERSATIONS)
    assert len(ids) == 60 and ids == sorted(set(ids))
    assert special_ids(tokenizer) <= set(ids)
    assert tokenizer.eos_token_id in ids


def test_calibration_tokens_come_before_the_merge_order_fill(tokenizer):
    used = {t for m in CONVERSATIONS for t in draft_vocab._encode(tokenizer, m)}
    ids = set(choose_subset(tokenizer, len(used | special_ids(tokenizer)), CONVERSATIONS))
    assert used <= ids
    # With room to spare, the rest is filled from the lowest ids (earliest merges) up.
    bigger = choose_subset(tokenizer, len(ids) + 10, CONVERSATIONS)
    assert set(bigger) - ids == set(sorted(set(range(len(tokenizer))) - ids)[:10])


def test_the_most_frequent_calibration_tokens_win_when_the_subset_is_small(tokenizer):
    counts = {}
    for m in CONVERSATIONS:
        for t in draft_vocab._encode(tokenizer, m):
            counts[t] = counts.get(t, 0) + 1
    top = max((t for t in counts if t not in special_ids(tokenizer)), key=lambda t: (counts[t], -t))
    ids = choose_subset(tokenizer, len(special_ids(tokenizer)) + 1, CONVERSATIONS)
    assert top in ids


def test_a_subset_larger_than_the_vocabulary_is_the_vocabulary(tokenizer):
    assert choose_subset(tokenizer, 10**6, CONVERSATIONS) == list(range(len(tokenizer)))


def test_subset_is_cached_and_reused(tokenizer, tmp_path, monkeypatch):
    corpus = corpus_file(tmp_path / "c.jsonl")
    first = load_subset(tokenizer, 80, corpus)
    files = list((cache_dir() / "draft_vocab").glob("*.json"))
    assert len(files) == 1
    # A second load reads the cache: computing again would fail here.
    monkeypatch.setattr(draft_vocab, "choose_subset", lambda *a: pytest.fail("recomputed"))
    assert load_subset(tokenizer, 80, corpus) == first


def test_cache_key_follows_size_and_corpus(tokenizer, tmp_path):
    corpus = corpus_file(tmp_path / "c.jsonl")
    load_subset(tokenizer, 80, corpus)
    load_subset(tokenizer, 90, corpus)
    corpus_file(corpus, CONVERSATIONS[:1])
    load_subset(tokenizer, 80, corpus)
    assert len(list((cache_dir() / "draft_vocab").glob("*.json"))) == 3


def test_unreadable_cache_is_rebuilt(tokenizer, tmp_path):
    corpus = corpus_file(tmp_path / "c.jsonl")
    first = load_subset(tokenizer, 80, corpus)
    (cached,) = (cache_dir() / "draft_vocab").glob("*.json")
    cached.write_text("{not json")
    assert load_subset(tokenizer, 80, corpus) == first


def test_shipped_calibration_set_is_varied():
    conversations = read_conversations()
    assert len(conversations) >= 50
    categories = {json.loads(line)["category"] for line in draft_vocab.CALIBRATION.read_text().splitlines() if line}
    assert {"code", "rewrite", "prose", "math", "chat"} <= categories
