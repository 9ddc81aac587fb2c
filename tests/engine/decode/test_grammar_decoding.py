"""Decoding held to a JSON schema: the output follows it, and speculation stays lossless
with respect to the constrained target (token-identical greedy, the same distribution sampled)."""
import json
from collections import Counter

import jsonschema
import pytest

from engine.core.events import Finished
from engine.core.settings import DecodeSettings, InvalidRequest, OutputFormat
from engine.decode.decoding import eos_token_ids, plain_decode, speculative_decode
from engine.decode.grammar import MAX_SCHEMA_CHARS, check_output_format
from engine.drafters import DraftModelDrafter, PromptLookupDrafter
from engine.models.runners.runner import ModelRunner
from engine.testing.tiny_models import build_model, build_tokenizer, perturbed_copy
from tests.engine.helpers import run_to_end

# Small enough that a random model finishes it within the token budget, varied enough that
# its tokens are chosen (a boolean, an enum, a bounded integer, key order fixed by the schema).
SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "word": {"enum": ["add", "print", "range"]},
                   "n": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["ok", "word", "n"],
    "additionalProperties": False,
}
WORDS = ["add", "print", "range", "return", "for"]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def _run(gen) -> Finished:
    result, _ = run_to_end(gen)
    assert isinstance(result, Finished), result
    return result


def _settings(schema=SCHEMA, **kw) -> DecodeSettings:
    return DecodeSettings(output_format=OutputFormat("json_schema", json.dumps(schema)), **kw)


@pytest.mark.parametrize("seed", range(2))
def test_greedy_speculation_under_a_schema_is_identical_to_plain_and_follows_it(tokenizer, seed):
    target = build_model(len(tokenizer), layers=3, seed=seed)
    drafter = perturbed_copy(target, 0.01, seed=seed + 100)
    eos = eos_token_ids(target, tokenizer)
    prompt = tokenizer("def add(a, b):")["input_ids"]
    free = _run(plain_decode(ModelRunner(target), tokenizer, prompt, DecodeSettings(max_new_tokens=40), eos))
    with pytest.raises(ValueError):
        json.loads(free.text)  # the random model writes no JSON of its own
    reference = _run(plain_decode(ModelRunner(target), tokenizer, prompt, _settings(max_new_tokens=80), eos))
    if reference.reason == "eos":
        jsonschema.validate(json.loads(reference.text), SCHEMA)
    else:  # out of tokens: what it wrote is still the start of such an object
        assert reference.text.lstrip().startswith("{")
    for k in (None, 4):
        for make in (lambda: DraftModelDrafter(drafter), PromptLookupDrafter):
            result = _run(speculative_decode(ModelRunner(target), make(), tokenizer, prompt,
                                             _settings(max_new_tokens=80, draft_length=k), eos))
            assert result.token_ids == reference.token_ids, (seed, k)


def test_a_finished_constrained_reply_parses_and_validates(tokenizer):
    # Across seeds of a sampled run, every reply that ends does so as a valid object.
    target = build_model(len(tokenizer), layers=2, seed=7)
    eos = eos_token_ids(target, tokenizer)
    prompt = tokenizer("for i in range(10):")["input_ids"]
    finished = 0
    for seed in range(8):
        result = _run(plain_decode(ModelRunner(target), tokenizer, prompt,
                                   _settings(mode="sample", temperature=0.8, seed=seed, max_new_tokens=160), eos))
        if result.reason == "eos":
            finished += 1
            jsonschema.validate(json.loads(result.text), SCHEMA)
    assert finished >= 2


def _chi_square(a: Counter, b: Counter) -> tuple[float, int]:
    """Pearson's statistic for two samples over the same categories, and its degrees of freedom."""
    keys = sorted(set(a) | set(b))
    na, nb = sum(a.values()), sum(b.values())
    stat = 0.0
    for key in keys:
        total = a[key] + b[key]
        for count, n in ((a[key], na), (b[key], nb)):
            expected = total * n / (na + nb)
            stat += (count - expected) ** 2 / expected
    return stat, len(keys) - 1


# Pearson chi-square critical values at p = 0.001 (df 1..4): a lossless run exceeds them once
# in a thousand seeds' worth of tests; a biased one (the residual drawn from the unmasked target,
# or drafts cut short) by far, at these counts.
CRITICAL = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47}


@pytest.mark.slow  # 320 sampled runs
def test_sampled_speculation_under_a_schema_draws_from_the_constrained_target(tokenizer):
    # An enum the random models have no preference among: the draft model (unconstrained)
    # proposes tokens the grammar often forbids, which verification must reject exactly.
    target = build_model(len(tokenizer), layers=1, seed=3)
    drafter = perturbed_copy(target, 0.05, seed=103)
    eos = eos_token_ids(target, tokenizer)
    prompt = tokenizer("The quick brown fox")["input_ids"]
    schema = {"enum": WORDS}
    plain, spec = Counter(), Counter()
    for seed in range(160):
        settings = _settings(schema, mode="sample", temperature=1.5, seed=seed, max_new_tokens=8)
        plain[_run(plain_decode(ModelRunner(target), tokenizer, prompt, settings, eos)).text] += 1
        settings = _settings(schema, mode="sample", temperature=1.5, seed=10_000 + seed, max_new_tokens=8,
                             draft_length=3)
        result = _run(speculative_decode(ModelRunner(target), DraftModelDrafter(drafter), tokenizer, prompt, settings, eos))
        spec[result.text] += 1
    assert set(plain) <= {json.dumps(w) for w in WORDS} and set(spec) <= {json.dumps(w) for w in WORDS}
    stat, df = _chi_square(plain, spec)
    assert df >= 2, (plain, spec)
    assert stat < CRITICAL[df], (stat, plain, spec)


def test_a_schema_that_cannot_be_used_is_refused_with_its_reason():
    with pytest.raises(InvalidRequest, match="/nope"):
        check_output_format(OutputFormat("json_schema", json.dumps({"$ref": "#/nope"})))
    with pytest.raises(InvalidRequest, match="at most"):
        big = {"type": "object", "properties": {f"k{i}": {"type": "string"} for i in range(MAX_SCHEMA_CHARS // 20)}}
        check_output_format(OutputFormat("json_schema", json.dumps(big)))
    with pytest.raises(InvalidRequest, match="needs its schema"):
        OutputFormat("json_schema")
    with pytest.raises(InvalidRequest, match="must be"):
        OutputFormat("yaml")
    check_output_format(OutputFormat("json_object"))
    check_output_format(OutputFormat("json_schema", json.dumps(SCHEMA)))


def _one_pass_a_token(target, tokenizer, prompt, settings, eos) -> list[int]:
    """The constrained target by definition: a pass for every token, its row masked, argmax."""
    from engine.decode.grammar import GrammarConstraint

    runner = ModelRunner(target)
    constraint = GrammarConstraint(settings.output_format, tokenizer, eos)
    logits, out = runner.forward(prompt), []
    while len(out) < settings.max_new_tokens:
        token = int(constraint.mask(logits)[-1].argmax())
        out.append(token)
        if token in eos:
            break
        constraint.accept([token])
        logits = runner.forward([token])
    return out


def test_tokens_the_schema_allows_alone_are_committed_without_a_pass_and_change_nothing(tokenizer):
    """After a key, the schema allows one token (the quote, the colon): plain and speculative
    decoding commit it without a pass, and give the tokens a pass per token gives."""
    target = build_model(len(tokenizer), layers=3, seed=5)
    drafter = perturbed_copy(target, 0.01, seed=105)
    eos = eos_token_ids(target, tokenizer)
    prompt = tokenizer("def add(a, b):")["input_ids"]
    settings = _settings(max_new_tokens=80)
    reference = _one_pass_a_token(target, tokenizer, prompt, settings, eos)
    plain = _run(plain_decode(ModelRunner(target), tokenizer, prompt, settings, eos))
    assert plain.stats.forced_tokens > 0
    assert list(plain.token_ids) == [t for t in reference if t not in eos]
    # One token from the prefill, one a pass (the last an end-of-text the output leaves out), the rest forced.
    assert 1 + plain.stats.target_passes + plain.stats.forced_tokens == len(plain.token_ids) + (plain.reason == "eos")
    speculative = _run(speculative_decode(ModelRunner(target), DraftModelDrafter(drafter), tokenizer, prompt, settings, eos))
    assert speculative.token_ids == plain.token_ids and speculative.stats.forced_tokens > 0


class _RecordingDrafter(DraftModelDrafter):
    """The draft model, noting how many of each draft's tokens the grammar allows in order."""

    def __init__(self, model, guided: bool) -> None:
        super().__init__(model)
        self.guided, self.forbidden = guided, []

    def follow(self, grammar) -> None:
        self.watch = grammar
        super().follow(grammar if self.guided else None)

    def propose(self, context, k, sampler):
        draft = super().propose(context, k, sampler)
        if self.watch._matcher is not None and draft.tokens:
            self.forbidden.append(len(draft.tokens) - self.watch.allowed_prefix(draft.tokens))
        return draft


@pytest.mark.parametrize("mode", ["greedy", "sample"])
def test_the_draft_model_drafts_only_what_the_schema_allows(tokenizer, mode):
    target = build_model(len(tokenizer), layers=3, seed=7)
    drafter = perturbed_copy(target, 0.3, seed=107)  # far enough from the target to wander off the schema
    eos = eos_token_ids(target, tokenizer)
    prompt = tokenizer("def add(a, b):")["input_ids"]
    settings = _settings(max_new_tokens=60, mode=mode, temperature=1.0, seed=3, draft_length=4)
    drafts = {}
    for guided in (False, True):
        recorder = _RecordingDrafter(drafter, guided)
        result = _run(speculative_decode(ModelRunner(target), recorder, tokenizer, prompt, settings, eos))
        drafts[guided] = (recorder.forbidden, result)
    assert sum(drafts[False][0]) > 0  # free, it drafts tokens the schema forbids
    assert drafts[True][0] and sum(drafts[True][0]) == 0  # guided, never
    if mode == "greedy":
        assert drafts[True][1].token_ids == drafts[False][1].token_ids
