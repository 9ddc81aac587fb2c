"""Prefix reuse: a request that continues an earlier one prefills only its new tokens, and what it
computes equals a fresh prefill's, logits and tokens, plain and speculative, greedy and sampled.

On a GGUF target (GgufRunner: every row batch-invariant, prompt rows included) the equality is
bit for bit, so it is asserted with torch.equal and ==."""
from __future__ import annotations

import pytest
import torch

from engine.core.settings import DecodeSettings
from engine.decode import decoding
from engine.models.runners.gguf_runner import GgufRunner
from engine.models.runners.prefix_reuse import RunnerPool, common_prefix, keep_common_prefix
from engine.session.compare import drain
from engine.session.session import Session
from engine.testing.tiny_gguf import write_gguf_pair

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SYSTEM = "You are a careful coding assistant."
FILE = "def area(w, h):\n    return w * h\n\nclass Box:\n    def __init__(self, w, h):\n        self.w = w\n"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return write_gguf_pair(tmp_path_factory.mktemp("reuse"), layers=3)


@pytest.fixture
def session(pair):
    return Session.load(pair[0], pair[1], precision="file")


@pytest.fixture
def small_chunks(monkeypatch):
    """Prefill chunks of 7 rows, so the tiny prompts are prefilled in several passes."""
    monkeypatch.setattr(decoding, "PREFILL_CHUNK", 7)


def _messages(*turns: str, system: str = SYSTEM) -> list[dict]:
    roles = ["user", "assistant"]
    return [{"role": "system", "content": system}] + [{"role": roles[i % 2], "content": t} for i, t in enumerate(turns)]


def _run(session, ids, settings, drafter):
    return drain(session.speculative(ids, settings, drafter) if drafter != "off" else session.plain(ids, settings))


def _fresh(session, ids, settings, drafter):
    session.forget_prefixes()
    return _run(session, ids, settings, drafter)


def test_runner_logits_after_a_kept_prefix_equal_a_fresh_prefill(session):
    ids = session.encode(_messages(FILE + "\nExplain this."))
    fresh = GgufRunner(session.target.model)
    whole = fresh.forward(ids, n_logits=len(ids))
    kept = GgufRunner(session.target.model)
    kept.forward(ids[:20])
    kept.forward(ids[20:31])
    kept.forward([5, 6, 7])  # a continuation the next prompt does not share
    assert keep_common_prefix(kept, ids) == 31 and kept.length == 31 and kept.tokens == ids[:31]
    rest = kept.forward(ids[31:], n_logits=len(ids) - 31)
    assert torch.equal(rest, whole[31:])
    assert torch.equal(kept.kv.k[:, :, : len(ids)], fresh.kv.k[:, :, : len(ids)])


@pytest.mark.parametrize("drafter", ["off", "model"])
@pytest.mark.parametrize("mode", ["greedy", "sample"])
def test_a_chat_turn_reuses_the_last_and_equals_a_fresh_prefill(session, small_chunks, drafter, mode, monkeypatch):
    # A fixed draft length: the adaptive one follows measured step times, and sampled speculation
    # draws its random numbers per drafted token, so two runs drafting differently draw different
    # (equally valid) samples whatever their caches. For the same reason the drafter reads the
    # whole prompt in both runs: from a window, the fresh run's drafter would start later in the
    # prompt than the one that kept the first turn, and draft otherwise.
    from engine.drafters import draft_model

    monkeypatch.setattr(draft_model, "DRAFT_WINDOW", 4096)
    settings = DecodeSettings(max_new_tokens=16, mode=mode, temperature=0.9, seed=5, draft_length=3)
    first_ids = session.encode(_messages(FILE + "\nExplain this."))
    first = _fresh(session, first_ids, settings, drafter)
    assert first.stats.cached_tokens == 0 and first.stats.prompt_done == len(first_ids)
    second_ids = session.encode(_messages(FILE + "\nExplain this.", first.text, "Now add a docstring."))
    reused = _run(session, second_ids, settings, drafter)
    shared = common_prefix(first_ids + list(first.token_ids), second_ids)
    assert reused.stats.cached_tokens == min(shared, len(second_ids) - 1) > len(first_ids) // 2
    assert reused.stats.prompt_tokens == len(second_ids) == reused.stats.prompt_done
    fresh = _fresh(session, second_ids, settings, drafter)
    assert fresh.stats.cached_tokens == 0
    assert reused.token_ids == fresh.token_ids


def test_regenerate_reuses_all_but_the_last_prompt_token(session):
    settings = DecodeSettings(max_new_tokens=12)
    ids = session.encode(_messages("Write a function that sums a list."))
    first = _fresh(session, ids, settings, "model")
    again = _run(session, ids, settings, "model")
    assert again.stats.cached_tokens == len(ids) - 1
    assert again.token_ids == first.token_ids


@pytest.mark.parametrize("change", ["system prompt", "earlier message"])
def test_a_changed_earlier_part_keeps_only_what_comes_before_it(session, change):
    settings = DecodeSettings(max_new_tokens=12)
    turns = [FILE + "\nExplain this.", "It computes areas.", "Now add a docstring."]
    ids = session.encode(_messages(*turns))
    _fresh(session, ids, settings, "model")
    if change == "system prompt":
        edited = session.encode(_messages(*turns, system="You answer in French."))
    else:
        edited = session.encode(_messages(turns[0], "It computes volumes.", turns[2]))
    reused = _run(session, edited, settings, "model")
    assert reused.stats.cached_tokens == common_prefix(ids, edited) < len(ids) - 3
    assert reused.token_ids == _fresh(session, edited, settings, "model").token_ids


def test_a_request_that_fails_keeps_no_cache(session, small_chunks, monkeypatch):
    """A failure may stop a pass half-way through the layers: the next request starts afresh."""
    from engine.core.events import Failed

    ids = session.encode(_messages(FILE + "\nExplain this."))
    session.forget_prefixes()
    real, calls = GgufRunner.forward_hidden, []

    def failing(self, token_ids, n_last=1):
        calls.append(len(token_ids))
        if len(calls) == 3:  # the third prefill chunk
            raise RuntimeError("the disk holding the weights went away")
        return real(self, token_ids, n_last)

    monkeypatch.setattr(GgufRunner, "forward_hidden", failing)
    events = list(session.plain(ids, DecodeSettings(max_new_tokens=8)))
    assert isinstance(events[-1], Failed) and "went away" in events[-1].error
    monkeypatch.setattr(GgufRunner, "forward_hidden", real)
    again = _run(session, ids, DecodeSettings(max_new_tokens=8), "off")
    assert again.stats.cached_tokens == 0
    assert again.token_ids == _fresh(session, ids, DecodeSettings(max_new_tokens=8), "off").token_ids


def test_the_kept_cache_records_what_verification_kept(session):
    """After speculation (drafts rejected and cropped) the cached tokens are the reply's."""
    ids = session.encode(_messages("Write a loop that prints 1 to 10."))
    result = _fresh(session, ids, DecodeSettings(max_new_tokens=20, draft_length=4), "model")
    (runner,) = session.target_caches._idle
    context = ids + list(result.token_ids)
    assert runner.tokens == context[: runner.length] and runner.length >= len(context) - 2


def test_side_by_side_lanes_each_keep_their_own_cache(session):
    from engine.session.side_by_side import side_by_side

    settings = DecodeSettings(max_new_tokens=10)
    messages = _messages("Say something about lists.")
    ids = session.encode(messages)
    session.forget_prefixes()
    list(side_by_side(session, messages, settings))
    assert session.target_caches.idle == 2
    assert sorted(session.target_caches.kept_tokens())[0] >= len(ids)


def test_a_cancelled_prefill_stops_between_chunks_and_keeps_what_it_computed(session, small_chunks):
    ids = session.encode(_messages(FILE * 2 + "\nExplain this."))
    session.forget_prefixes()
    seen = []

    def cancel():
        return len(seen) >= 2

    events = []
    for event in session.plain(ids, DecodeSettings(max_new_tokens=8), cancel=cancel):
        events.append(event)
        if hasattr(event, "stats") and event.stats.prompt_done:
            seen.append(event.stats.prompt_done)
    finished = events[-1]
    assert finished.reason == "cancelled" and finished.token_ids == ()
    assert seen[:2] == [7, 14]  # progress, chunk by chunk
    again = _run(session, ids, DecodeSettings(max_new_tokens=8), "off")
    assert again.stats.cached_tokens == 14
    assert again.token_ids == _fresh(session, ids, DecodeSettings(max_new_tokens=8), "off").token_ids


def _draft_model(session):
    drafter = session.drafter("model")
    return getattr(drafter, "model", drafter)  # inside prompt lookup's wrapper, where there is one


def test_a_long_prompt_is_drafted_from_its_last_window(session, monkeypatch):
    """Past DRAFT_WINDOW new tokens the drafter reads only the last DRAFT_WINDOW of them: its
    cache then holds what a fresh drafter fed just those tokens holds, bit for bit, and the
    reply is still the target's own (lossless)."""
    from engine.drafters import draft_model

    W = 60  # more than a short follow-up turn adds, under half the pasted file's prompt
    monkeypatch.setattr(draft_model, "DRAFT_WINDOW", W)
    drafter = _draft_model(session)
    settings = DecodeSettings(max_new_tokens=12, draft_length=3)
    ids = session.encode(_messages(FILE + "\nExplain this."))
    assert len(ids) > 2 * W
    session.forget_prefixes()
    drafter.prepare(ids)
    window = ids[len(ids) - 1 - W : -1]
    assert drafter._origin == len(ids) - 1 - W and drafter.runner.tokens == window
    kept = drafter.runner.kv.k[:, :, :W].clone()
    drafter.forget()
    drafter.prepare(window + [ids[-1]])  # a prompt of only those tokens
    assert drafter._origin == 0 and torch.equal(drafter.runner.kv.k[:, :, :W], kept)
    # Speculating with the window gives the plain reply.
    speculated = _fresh(session, ids, settings, "model")
    origin = drafter._origin
    assert origin == len(ids) - W and speculated.stats.drafted > 0  # it read prompt + first token
    # The next turn keeps the window's cache and reads only its new tokens.
    more = session.encode(_messages(FILE + "\nExplain this.", speculated.text, "Shorter."))
    drafter.prepare(more)
    assert drafter._origin == origin and drafter.runner.tokens == more[origin:-1]
    # An edit before the window's start: it starts again from the new prompt's last window.
    edited = session.encode(_messages(FILE.replace("area", "size") + "\nExplain this."))
    drafter.prepare(edited)
    assert drafter._origin == len(edited) - 1 - W and drafter.runner.tokens == edited[-1 - W : -1]
    assert speculated.token_ids == _fresh(session, ids, settings, "off").token_ids


def test_a_long_stretch_decoded_without_drafting_is_caught_up_on_from_its_last_window(session, monkeypatch):
    """While speculation is off the drafter reads nothing; when a probe drafts again it reads
    only the last window of the tokens it missed (catch_up_limit), and drafts what a drafter
    given just that window drafts."""
    from engine.core.sampler import Sampler
    from engine.drafters import draft_model

    W = 8
    monkeypatch.setattr(draft_model, "DRAFT_WINDOW", W)
    drafter = _draft_model(session)
    assert drafter.catch_up_limit == W + 1
    ids = session.encode(_messages(FILE + "\nExplain this."))
    session.forget_prefixes()
    drafter.prepare(ids)
    prompt_origin = drafter._origin
    off = ids[5:35]  # 30 tokens decoded while the drafter read none
    context = ids + off
    greedy = Sampler(DecodeSettings())
    ours = drafter.propose(context, 2, greedy)
    origin = len(context) - (W + 1)
    assert drafter._origin == origin > prompt_origin and drafter.runner.tokens[: W + 1] == context[origin:]
    assert drafter.catch_up_s > 0
    fresh = draft_model.DraftModelDrafter(session.drafter_model.model)
    fresh.prepare(context[origin:])
    assert ours.tokens == fresh.propose(context[origin:], 2, greedy).tokens
    # A few tokens behind is an ordinary catch-up: the cache is kept.
    drafter.observe(len(context))
    drafter.propose(context + off[:3], 1, greedy)
    assert drafter._origin == origin


class _FakeRunner:
    """What the pool reads of a runner: its tokens, length, crop and memory."""

    can_crop = True

    def __init__(self, kv_bytes=100):
        self.tokens, self.kv_bytes = [], kv_bytes

    @property
    def length(self):
        return len(self.tokens)

    def reset(self):
        self.tokens = []

    def crop(self, n):
        del self.tokens[n:]


def test_pool_leases_the_cache_with_the_longest_prefix_and_stays_bounded():
    pool = RunnerPool(_FakeRunner, max_idle=3, max_idle_bytes=250)
    a, b = pool.lease([1, 2, 3]), pool.lease([1, 2, 3])
    assert a is not b  # two requests at once never share a cache
    a.tokens, b.tokens = [1, 2, 3, 4], [7, 8, 9]
    pool.release(a)
    pool.release(b)
    assert pool.lease([7, 8, 9, 10]) is b
    assert pool.lease([1, 2, 5]) is a  # two tokens shared beat none
    pool.release(a)
    pool.release(b)
    c = pool.lease([42])  # shares nothing: a new cache while the pool is not full
    assert c is not a and c is not b
    c.tokens = [42, 43]
    pool.release(c)  # three caches of 100 bytes exceed 250: the least recently used goes
    assert pool.idle == 2 and a not in pool._idle


def test_a_cache_that_cannot_crop_is_kept_only_when_extended():
    runner = _FakeRunner()
    runner.can_crop = False
    runner.tokens = [1, 2, 3]
    assert keep_common_prefix(runner, [1, 2, 3, 4, 5]) == 3
    runner.tokens = [1, 2, 3]
    assert keep_common_prefix(runner, [1, 2, 9, 9]) == 0 and runner.tokens == []
