"""The chat's and the demo's stats line while a long prompt is read, and what a reply keeps."""
from app.widgets.reply_stats import describe, describe_meta, reply_meta
from engine.core.events import Finished, RunStats


def test_a_long_prompt_shows_its_progress_and_what_was_kept():
    reading = RunStats(prompt_tokens=3806, prompt_done=1280, cached_tokens=1002)
    assert describe(reading) == "reading the prompt: 1,280 of 3,806 tokens (1,002 kept from before)"
    assert describe(RunStats(prompt_tokens=600, prompt_done=256)) == "reading the prompt: 256 of 600 tokens"
    # Once tokens come, the line is the reply's speed again.
    decoding = RunStats(prompt_tokens=600, prompt_done=600, new_tokens=3, tok_per_s=12.0)
    assert describe(decoding) == "12.0 tok/s · 3 tokens"


def test_a_reply_keeps_its_prompt_size_reuse_and_first_token_time():
    stats = RunStats(prompt_tokens=1226, prompt_done=1226, cached_tokens=1001, new_tokens=96, tok_per_s=14.2, ttft_s=3.25)
    meta = reply_meta(Finished("max_new_tokens", stats, text="x"), None)
    assert (meta["prompt_tokens"], meta["cached_tokens"], meta["ttft_s"]) == (1226, 1001, 3.25)
    assert "prompt 1,226 tokens, 1,001 of them kept from before, first token after 3.25 s" in describe_meta(meta)
    # A reply saved before these fields existed shows no prompt line.
    assert "prompt" not in describe_meta({"tok_per_s": 3.0, "new_tokens": 4})
