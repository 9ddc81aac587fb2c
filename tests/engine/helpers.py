from engine.core.events import Failed, Finished, Tokens


def run_to_end(events):
    """Drain an engine generator; returns (Finished or Failed, list of Tokens events)."""
    tokens = []
    for event in events:
        if isinstance(event, Tokens):
            tokens.append(event)
        if isinstance(event, (Finished, Failed)):
            return event, tokens
    raise AssertionError("the engine stopped without Finished or Failed")


def assert_speculation_matches_plain(target, drafter, tokenizer, prompts, ks=(None, 1, 4, 8), max_new_tokens=32) -> int:
    """Greedy speculative decoding with a draft model equals plain decoding token for token, for
    every prompt and draft length (None: adaptive). Returns how many drafts were accepted."""
    from engine.core.settings import DecodeSettings
    from engine.decode.decoding import eos_token_ids, plain_decode, speculative_decode
    from engine.drafters import DraftModelDrafter
    from engine.models.runners.runner import ModelRunner

    eos = eos_token_ids(target, tokenizer)
    accepted = 0
    for text in prompts:
        prompt = tokenizer(text)["input_ids"]
        plain, _ = run_to_end(plain_decode(ModelRunner(target), tokenizer, prompt, DecodeSettings(max_new_tokens=max_new_tokens), eos))
        for k in ks:
            settings = DecodeSettings(max_new_tokens=max_new_tokens, draft_length=k)
            spec, _ = run_to_end(speculative_decode(ModelRunner(target), DraftModelDrafter(drafter), tokenizer, prompt, settings, eos))
            assert isinstance(spec, Finished), spec
            assert spec.token_ids == plain.token_ids, (text, k)
            accepted += spec.stats.accepted
    return accepted


def recommended(results):
    """The one fit result ``engine.models.planning.fit.recommend`` marks recommended (None: none fits)."""
    return next((r for r in results if r.recommended), None)
