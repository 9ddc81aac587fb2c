"""StatsTracker's rates: the whole run's, and the decode rate after the prefill's first token."""
import pytest

import engine.decode.stats as stats_module
from engine.decode.stats import StatsTracker


@pytest.fixture
def clock(monkeypatch):
    now = {"t": 100.0}
    monkeypatch.setattr(stats_module.time, "perf_counter", lambda: now["t"])
    return now


def test_decode_rate_leaves_out_the_prefill_and_its_token(clock):
    tracker = StatsTracker()
    assert tracker.snapshot().decode_tok_per_s == 0.0
    clock["t"] += 2.0  # the prefill: its one token after 2 s
    tracker.add_tokens(1)
    first = tracker.snapshot()
    assert first.ttft_s == 2.0 and first.decode_tok_per_s == 0.0  # nothing decoded after it yet
    clock["t"] += 0.5
    tracker.add_tokens(3)  # a speculative pass: 3 tokens in 0.5 s
    clock["t"] += 0.5
    tracker.add_tokens(1)
    s = tracker.snapshot()
    assert s.new_tokens == 5 and s.seconds == 3.0
    assert s.tok_per_s == pytest.approx(5 / 3.0)
    assert s.decode_tok_per_s == pytest.approx(4 / 1.0)


def test_a_first_block_of_several_tokens_counts_as_the_prefills(clock):
    tracker = StatsTracker()
    clock["t"] += 1.0
    tracker.add_tokens(2)
    clock["t"] += 2.0
    tracker.add_tokens(6)
    assert tracker.snapshot().decode_tok_per_s == pytest.approx(6 / 2.0)
