"""`tandem serve` on the real default pair, read by the official openai client.

Slow: loads the Qwen2.5-Coder 1.5B target (fp32, "fp32", where greedy speculation is
token-identical to plain decoding) and its 0.5B drafter."""
import pytest

from engine.core.settings import DecodeSettings
from engine.serving.server import ServerConfig, run_in_thread
from engine.session.compare import compare
from engine.session.session import Session

pytestmark = pytest.mark.slow

PROMPT = "Write a Python function that checks whether a string is a palindrome."
MAX_TOKENS = 32


def test_the_openai_client_streams_what_tandem_compare_decodes(default_pair_paths):
    from openai import OpenAI

    session = Session.load(default_pair_paths[0], default_pair_paths[1], precision="fp32", device="cpu")
    # What `tandem compare PROMPT --precision fp32 --max-new-tokens 32 --draft-length 3` runs: plain,
    # then speculative. A fixed k always drafts (the adaptive one may switch drafting off in fp32).
    result = compare(session, PROMPT, DecodeSettings(max_new_tokens=MAX_TOKENS, draft_length=3), drafter="model")
    assert result.identical, result.divergence
    with run_in_thread(session, ServerConfig(port=0)) as handle:
        client = OpenAI(base_url=handle.url + "/v1", api_key="unused", max_retries=0, timeout=300)
        stream = client.chat.completions.create(
            model=handle.worker.model_id, messages=[{"role": "user", "content": PROMPT}], temperature=0,
            max_tokens=MAX_TOKENS, stream=True, stream_options={"include_usage": True},
            extra_body={"speculative": {"drafter": "model", "draft_length": 3}})
        chunks = list(stream)
        counters = handle.counters()
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == result.plain.text == result.speculative.text
    last = chunks[-1]
    assert last.usage.prompt_tokens == len(result.prompt_ids)
    assert last.usage.completion_tokens == len(result.plain.token_ids)
    timings = last.model_extra["timings"]
    assert timings["draft_n"] > 0 and 0 < timings["draft_n_accepted"] <= timings["draft_n"]
    assert timings["mean_accepted_length"] > 1
    assert (timings["draft_n"], timings["draft_n_accepted"]) == (result.speculative.stats.drafted,
                                                                 result.speculative.stats.accepted)
    assert counters.num_draft_tokens == timings["draft_n"] and counters.num_accepted_tokens == timings["draft_n_accepted"]
    print(f"\nserved {timings['predicted_n']} tokens at {timings['predicted_per_second']:.2f} tok/s after the first;"
          f" drafted {timings['draft_n']}, accepted {timings['draft_n_accepted']},"
          f" mean accepted length {timings['mean_accepted_length']:.2f}")
