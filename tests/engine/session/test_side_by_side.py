"""The side-by-side run: fair interleaving, origin-coloured text, honest comparison."""
import pytest

from engine.core.events import Failed, Finished, Stats, Tokens
from engine.core.settings import DecodeSettings
from engine.decode.token_origin import OriginTracker
from engine.models.loading.loader import LoadedModel
from engine.session.chat import chat_reply
from engine.session.session import Session
from engine.session.side_by_side import PLAIN, SPECULATIVE, LaneEvent, SideBySideResult, side_by_side


@pytest.fixture()
def session(tiny_pair):
    import torch

    tokenizer, target, drafter = tiny_pair
    wrap = lambda name, model: LoadedModel(name, model, tokenizer, torch.device("cpu"), torch.float32, 0.0)
    return Session(wrap("tiny-target", target), wrap("tiny-drafter", drafter))


def collect(events):
    lanes, result = {PLAIN: [], SPECULATIVE: []}, None
    for item in events:
        if isinstance(item, SideBySideResult):
            result = item
        else:
            lanes[item.lane].append(item)
    return lanes, result


def test_both_lanes_stream_and_agree(session):
    settings = DecodeSettings(max_new_tokens=40, draft_length=3)  # fixed k: drafting regardless of timings
    lanes, result = collect(side_by_side(session, "def add(a, b):", settings))
    assert result is not None and result.identical and result.divergence is None
    for lane in (PLAIN, SPECULATIVE):
        tokens = [e for e in lanes[lane] if isinstance(e.event, Tokens)]
        assert len(tokens) >= 2
        text = "".join(seg.text for e in tokens for seg in e.segments)
        finished = lanes[lane][-1].event
        assert isinstance(finished, Finished) and text == "".join(e.event.text for e in tokens)
        assert text == finished.text
    spec_segments = [s for e in lanes[SPECULATIVE] for s in e.segments]
    assert any(s.from_draft for s in spec_segments), "the drafter got nothing accepted"
    assert not any(s.from_draft for e in lanes[PLAIN] for s in e.segments)
    assert result.speculative.stats.accepted > 0


def test_interleaving_advances_the_lane_that_is_behind(session, monkeypatch):
    """On a fake clock where a plain step costs 3 units and a speculative step 1, the lane that
    is behind always goes next: about three speculative steps per plain step, and each lane's
    restated seconds are exactly its own steps' cost."""
    now = {"t": 0.0}

    def charged(make, cost):
        def run(*args, **kwargs):
            for event in make(*args, **kwargs):
                if isinstance(event, Tokens):
                    now["t"] += cost  # the step's compute happens inside next()
                yield event
        return run

    monkeypatch.setattr(session, "plain", charged(session.plain, 3.0))
    monkeypatch.setattr(session, "speculative", charged(session.speculative, 1.0))
    order = []
    settings = DecodeSettings(max_new_tokens=30, draft_length=0)  # one token per step in both
    for item in side_by_side(session, "for i in range(10):", settings, clock=lambda: now["t"]):
        if isinstance(item, LaneEvent) and isinstance(item.event, Tokens):
            order.append(item.lane)
        if isinstance(item, SideBySideResult):
            result = item
    assert order[:8] == [PLAIN, SPECULATIVE, SPECULATIVE, SPECULATIVE, PLAIN, SPECULATIVE, SPECULATIVE, SPECULATIVE]
    assert result.plain.stats.seconds == 3.0 * 30 and result.speculative.stats.seconds == 1.0 * 30
    assert result.speedup == pytest.approx(3.0)
    assert result.plain.stats.ttft_s == 3.0 and result.speculative.stats.ttft_s == 1.0
    # Without the prefill: 29 tokens after the first, over the 29 steps after it.
    assert result.plain.stats.decode_tok_per_s == pytest.approx(1 / 3.0)
    assert result.speculative.stats.decode_tok_per_s == pytest.approx(1.0)


def test_stats_use_each_lanes_own_compute_time(session):
    lanes, result = collect(side_by_side(session, "The quick brown fox", DecodeSettings(max_new_tokens=24)))
    for lane, finished in ((PLAIN, result.plain), (SPECULATIVE, result.speculative)):
        stats = [e.event.stats for e in lanes[lane] if isinstance(e.event, Stats)]
        seconds = [s.seconds for s in stats]
        assert seconds == sorted(seconds)
        assert finished.stats.ttft_s is not None and 0 < finished.stats.ttft_s <= finished.stats.seconds
        assert finished.stats.tok_per_s == pytest.approx(finished.stats.new_tokens / finished.stats.seconds)


def test_divergence_is_located_in_both_texts(session, tiny_pair, monkeypatch):
    """Force a difference by making the speculative lane's target see a different prompt."""
    import engine.session.side_by_side as sbs

    real_speculative = session.speculative

    def skewed(prompt_ids, settings, drafter="model", cancel=lambda: False):
        return real_speculative(prompt_ids[:-2] + prompt_ids[-1:], settings, drafter, cancel)

    monkeypatch.setattr(session, "speculative", skewed)
    _, result = collect(sbs.side_by_side(session, "Speculative decoding is", DecodeSettings(max_new_tokens=20)))
    assert not result.identical
    d = result.divergence
    assert d is not None and d.top2_gap is not None and d.top2_gap >= 0
    plain_chars, spec_chars = result.divergence_chars
    assert result.plain.text[:plain_chars] == result.speculative.text[:spec_chars]


def test_empty_prompt_is_a_readable_failure(session):
    items = list(side_by_side(session, "   ", DecodeSettings()))
    assert len(items) == 1 and isinstance(items[0].event, Failed) and "empty" in items[0].event.error


def test_cancel_stops_both_lanes(session):
    calls = {"n": 0}

    def cancel():
        calls["n"] += 1
        return calls["n"] > 6

    lanes, result = collect(side_by_side(session, "hello", DecodeSettings(max_new_tokens=200), cancel=cancel))
    assert result.plain.reason == "cancelled" and result.speculative.reason == "cancelled"
    assert result.divergence is None


def test_chat_reply_streams_segments(session):
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "add two numbers"}]
    items = list(chat_reply(session, messages, DecodeSettings(max_new_tokens=20)))
    finished = items[-1].event
    assert isinstance(finished, Finished)
    assert "".join(s.text for i in items for s in i.segments) == finished.text
    bad = list(chat_reply(session, [{"role": "assistant", "content": "x"}], DecodeSettings()))
    assert isinstance(bad[0].event, Failed)


def test_origin_tracker_credits_split_characters_to_the_completing_token(tiny_pair):
    tokenizer = tiny_pair[0]
    text = "naïve 東京 🙂 ok"
    ids = tokenizer(text)["input_ids"]
    tracker = OriginTracker(tokenizer)
    released, segments = "", []
    for i, token in enumerate(ids):
        decoded = tokenizer.decode(ids[: i + 1])
        stable = decoded.rstrip("\ufffd")
        delta = stable[len(released):]
        released = stable
        segments += tracker.feed([token], [i % 2 == 0], delta)
    assert "".join(s.text for s in segments) == text
    assert tracker.char_offset(0) == 0 and tracker.char_offset(len(ids)) == len(text)
