"""Prompt lookup drafting in front of a draft model: which source drafts, and that the output
never changes."""
import pytest
import torch

from engine.core.events import Finished
from engine.core.sampler import Sampler
from engine.core.settings import DecodeSettings
from engine.decode.decoding import plain_decode, speculative_decode
from engine.drafters import DraftModelDrafter
from engine.drafters.lookup_first import LookupFirstDrafter
from engine.drafters.prompt_lookup import longest_match_continuation
from engine.models.runners.runner import ModelRunner
from tests.engine.helpers import run_to_end


def test_longest_match_wins_and_the_latest_occurrence_is_continued():
    # [1, 2, 3] occurs at 0 (then 9) and at 4 (then 7); the 4-gram [5, 1, 2, 3] nowhere earlier.
    context = [1, 2, 3, 9, 1, 2, 3, 7, 5, 1, 2, 3]
    assert longest_match_continuation(context, 2) == (3, [7, 5])
    assert longest_match_continuation(context, 10) == (3, [7, 5, 1, 2, 3])
    assert longest_match_continuation([4, 5, 6], 3) == (0, [])  # nothing recurs
    assert longest_match_continuation(context, 0) == (0, [])
    assert longest_match_continuation([8, 8], 3) == (1, [8])  # the match may overlap the tail
    assert longest_match_continuation(context, 2, min_ngram=4) == (0, [])  # only 3-grams recur


def _latest_match_by_scanning(context: list[int], k: int, max_ngram: int, min_ngram: int) -> tuple[int, list[int]]:
    """The definition, position by position: the longest trailing n-gram with an earlier
    occurrence (one token at least after it), continued from its latest one."""
    for n in range(min(max_ngram, len(context) - 1), min_ngram - 1, -1):
        tail = context[-n:]
        for start in range(len(context) - 1 - n, -1, -1):
            if context[start:start + n] == tail:
                return n, context[start + n:start + n + k]
    return 0, []


@pytest.mark.parametrize("vocab", [3, 40, 70000, 151936])
def test_the_byte_search_finds_what_scanning_finds(vocab):
    # Ids above 255 span several bytes: a byte match straddling two tokens (ids whose low bytes
    # are 0, as 65536 and 131072 here) must not count, and the search goes on further back.
    rng = torch.Generator().manual_seed(vocab)
    for trial in range(200):
        length = int(torch.randint(2, 120, (1,), generator=rng))
        ids = torch.randint(0, vocab, (length,), generator=rng)
        if vocab > 65536 and trial % 2:
            ids = torch.where(ids % 3 == 0, torch.tensor(65536), torch.where(ids % 3 == 1, torch.tensor(131072), torch.tensor(1)))
        context = ids.tolist()
        for max_ngram, min_ngram in ((8, 1), (3, 1), (8, 3)):
            assert longest_match_continuation(context, 4, max_ngram, min_ngram) == \
                _latest_match_by_scanning(context, 4, max_ngram, min_ngram), context


def _greedy() -> Sampler:
    return Sampler(DecodeSettings(max_new_tokens=8))


def test_lookup_drafts_while_the_text_copies_itself_then_the_model_takes_over(tiny_pair):
    _, _, drafter_model = tiny_pair
    drafter = LookupFirstDrafter(DraftModelDrafter(drafter_model))
    passage = torch.randperm(200, generator=torch.Generator().manual_seed(1)).add(100).tolist()  # ids 100..299
    context = passage + passage[:6]  # the output has started to repeat the passage
    drafter.reset()
    drafter.prepare(context)
    for step in range(4):  # the target keeps copying: lookup's guesses are right
        draft = drafter.propose(context, 4, _greedy())
        start = len(context) - len(passage)
        if step > 0:  # the first draft is the model's; its shadow-scored guess earns lookup the next
            assert list(draft.tokens) == passage[start : start + 4]
        right = 0  # drafts that match the passage are accepted
        while right < len(draft.tokens) and draft.tokens[right] == passage[start + right]:
            right += 1
        drafter.observe(len(context) + right)
        context = passage + passage[: start + 5]  # the target goes on copying
    assert (drafter.lookup_steps, drafter.model_steps) == (3, 1)
    assert drafter.lookup_score > drafter.prior
    # Now the target writes a recurring phrase (20, 21, 22) followed by something new each time:
    # the phrase matches, so lookup guesses, and every guess is wrong from its first token.
    context = context + [20, 21, 22, 300]
    drafter.observe(len(context) - 4)
    score_after_copying = drafter.lookup_score
    for i in range(6):
        drafter.propose(context + [20, 21, 22], 4, _greedy())
        drafter.observe(len(context) + 3)
        context = context + [20, 21, 22, 301 + i]
    drafter.propose(context, 4, _greedy())  # scores the last guess
    # Two failed guesses hand drafting to the model (whose random drafts here fail as well, so
    # cheap lookup gets its turn again later).
    assert drafter.model_steps >= 2, "the model must take over once lookup keeps failing"
    assert drafter.lookup_steps <= 3 + 5
    assert drafter.lookup_score < min(score_after_copying, drafter.prior)


def test_greedy_output_is_unchanged_and_both_sources_draft(tiny_pair):
    tokenizer, target, drafter_model = tiny_pair
    # A prompt the tiny target is likely to echo in places: lookup hits on 1-grams at least.
    prompt = tokenizer("def add(a, b):\n    return a + b\n\ndef add(a, b):")["input_ids"]
    settings = DecodeSettings(max_new_tokens=48)
    plain, _ = run_to_end(plain_decode(ModelRunner(target), tokenizer, prompt, settings, set()))
    for k in (None, 2, 5):
        drafter = LookupFirstDrafter(DraftModelDrafter(drafter_model), min_match=1, model_cost=1.0, lookup_prior=1.5)
        result, _ = run_to_end(speculative_decode(ModelRunner(target), drafter, tokenizer, prompt,
                                                  DecodeSettings(max_new_tokens=48, draft_length=k), set()))
        assert isinstance(result, Finished), result
        assert result.token_ids == plain.token_ids, k
        if k is not None:  # (the adaptive k may switch speculation off on this tiny pair)
            assert drafter.lookup_steps > 0 and drafter.model_steps > 0, (k, drafter.lookup_steps, drafter.model_steps)


def test_session_drafts_with_lookup_first_unless_asked_not_to(tiny_pair):
    from engine.core.settings import DrafterOptions
    from engine.models.loading.loader import LoadedModel
    from engine.session.session import Session

    tokenizer, target, drafter_model = tiny_pair

    def loaded(model, name):
        return LoadedModel(name=name, model=model, tokenizer=tokenizer, device=torch.device("cpu"),
                           dtype=torch.float32, seconds=0.0, weights="fp32")

    on = Session(loaded(target, "t"), loaded(drafter_model, "d"), DrafterOptions(head="full"))
    assert isinstance(on.drafter("model"), LookupFirstDrafter)
    assert on.drafter("model").name == "d + prompt lookup"
    off = Session(loaded(target, "t"), loaded(drafter_model, "d"), DrafterOptions(head="full", lookup=False))
    assert isinstance(off.drafter("model"), DraftModelDrafter)


def test_the_model_reads_the_prompt_only_when_it_first_drafts(tiny_pair):
    """Where lookup drafts, the draft model's prefill is not paid; its first draft reads the
    context then (its window of it), and drafts what a drafter prepared up front drafts."""
    _, _, drafter_model = tiny_pair
    model = DraftModelDrafter(drafter_model)
    drafter = LookupFirstDrafter(model, lookup_prior=10.0)  # lookup trusted from the start
    passage = torch.randperm(200, generator=torch.Generator().manual_seed(2)).add(100).tolist()
    context = passage + passage[:6]
    model.forget()
    drafter.prepare(context)
    draft = drafter.propose(context, 4, _greedy())
    assert list(draft.tokens) == passage[6:10] and drafter.lookup_steps == 1
    drafter.observe(len(context) + 4)
    assert model.runner.length == 0, "lookup drafted: the model has read nothing yet"
    fresh = list(range(300, 340))  # nothing recurs: the model drafts, reading the context first
    context = context + passage[6:11] + fresh
    ours = drafter.propose(context, 3, _greedy())
    # Read up to the context's end (from its window's start: draft_model.DRAFT_WINDOW).
    assert drafter.model_steps == 1 and model._origin + model.runner.length >= len(context) - 1
    other = DraftModelDrafter(drafter_model)
    other.prepare(context)
    assert ours.tokens == other.propose(context, 3, _greedy()).tokens


def test_with_speculation_switched_off_lookup_still_verifies_the_guesses_that_pay(tiny_pair):
    """Seeded costs where the model's drafts do not pay start the request with speculation off;
    lookup's guesses cost no drafter step, so where its record pays for the wider pass they are
    verified anyway (the loop asks ``guess_while_off`` on every off pass), and the output is
    plain decoding's."""
    from engine.decode.draft_length import MeasuredCosts

    tokenizer, target, drafter_model = tiny_pair
    prompt = tokenizer("one two three four one two three four one two three four")["input_ids"]
    settings = DecodeSettings(max_new_tokens=40)
    plain, _ = run_to_end(plain_decode(ModelRunner(target), tokenizer, prompt, settings, set()))
    # A draft step dearer than a target pass: no draft length pays, speculation starts off.
    costs = {"measured": MeasuredCosts(v0=0.05, v1=0.005, draft_step_s=1.0, acceptance=0.0)}
    drafter = LookupFirstDrafter(DraftModelDrafter(drafter_model), min_match=1, lookup_prior=20.0)
    asked = []
    real = drafter.guess_while_off
    drafter.guess_while_off = lambda *args: asked.append(real(*args)) or asked[-1]
    result, _ = run_to_end(speculative_decode(ModelRunner(target), drafter, tokenizer, prompt, settings, set(),
                                              costs=costs))
    assert result.token_ids == plain.token_ids
    assert any(j > 0 for j in asked) and drafter.lookup_steps > 0  # a guess verified while off
    assert result.stats.drafted > 0


def test_a_guess_while_off_is_verified_only_where_lookups_record_pays(tiny_pair):
    """``guess_while_off`` weighs lookup's expected tokens per guess against what the wider
    pass costs; a guess it does not verify is scored against what the target wrote next."""
    drafter = LookupFirstDrafter(DraftModelDrafter(tiny_pair[2]), min_match=3, lookup_prior=3.0)
    passage = list(range(100, 140))
    context = passage + passage[:5]
    cost = lambda j: 1.0 + 0.25 * j  # noqa: E731  (a pass of j drafts, in one-token passes)
    # Three right expected: (3 + 1) / 1.75 for three drafts beats two's 3 / 1.5 and four's 4 / 2.0.
    assert drafter.guess_while_off(context, 4, cost) == 3
    assert drafter.propose(context, 3, _greedy()).tokens == tuple(passage[5:8])
    drafter.observe(len(context) + 3)
    context = passage + passage[:9]  # all three right, and the target's own
    assert drafter.lookup_steps == 1 and drafter.model_steps == 0

    doubtful = LookupFirstDrafter(DraftModelDrafter(tiny_pair[2]), min_match=3, lookup_prior=0.1)  # failed guesses
    assert doubtful.guess_while_off(context, 4, cost) == 0  # (0.1 + 1) / 1.25 < 1.1: a plain pass
    context = context + [passage[9]]  # the target wrote what lookup guessed
    doubtful.guess_while_off(context, 4, cost)
    assert doubtful.lookup_score > 0.1  # the unverified guess was scored


def test_a_guess_verified_whole_while_off_is_credited_the_targets_next_token(tiny_pair):
    """The record decides how much of a guess is verified; scored only on what was verified it
    could never grow past that length, and the guesses stayed short. The whole guess is scored:
    where the target's own token continues it, that counts too."""
    drafter = LookupFirstDrafter(DraftModelDrafter(tiny_pair[2]), min_match=3, lookup_prior=1.0, decay=0.6)
    passage = list(range(100, 140))
    context = passage + passage[:5]
    cost = lambda j: 1.0 + 0.25 * j  # noqa: E731
    assert drafter.guess_while_off(context, 4, cost) == 1  # (1 + 1) / 1.25 beats two's 2 / 1.5
    assert drafter.propose(context, 1, _greedy()).tokens == (passage[5],)
    drafter.observe(len(context) + 1)
    context = passage + passage[:7]  # the guess's token accepted, and the target's is the guess's next
    drafter.guess_while_off(context, 4, cost)
    assert drafter.lookup_score == pytest.approx(0.6 * 1.0 + 0.4 * 2)


def test_the_models_deferred_prefill_is_reported_as_a_prefill_not_a_catch_up(tiny_pair):
    """The model reads the prompt (its window of it) only when it first drafts: that pass's
    seconds say so as ``prefill_s``, a one-off of the request, and not as ``catch_up_s``, which
    the controller divides by the off tokens to price every later probe."""
    _, _, drafter_model = tiny_pair
    drafter = LookupFirstDrafter(DraftModelDrafter(drafter_model))
    context = torch.randperm(150, generator=torch.Generator().manual_seed(2)).add(100).tolist()  # nothing recurs
    drafter.reset()
    drafter.prepare(context)
    first = drafter.propose(context, 3, _greedy())
    assert len(first.tokens) == 3 and drafter.model_steps == 1
    assert drafter.prefill_s > 0.0 and drafter.catch_up_s == 0.0
    drafter.observe(len(context) + 1)
    drafter.propose(context + [first.tokens[0], 7], 3, _greedy())
    assert drafter.prefill_s == 0.0  # read once: the next draft pays no prefill
