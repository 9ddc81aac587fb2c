"""The int8 default pair end to end (Qwen2.5-Coder 1.5B target quantized, 0.5B int8 drafter).

Slow: needs the set-up to have installed the pair (make setup); the first run also converts the
target's weights to int8 and caches them in the user cache dir.
"""
import pytest

from engine.core.settings import DecodeSettings
from engine.quant import weight_cache
from engine.session.compare import compare
from engine.session.session import Session

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def session(default_pair_paths):
    target, drafter = default_pair_paths
    return Session.load(target, drafter, precision="int8", device="cpu")


def test_int8_target_is_cached_and_speculation_matches_its_plain_decoding(session, default_pair_paths):
    assert session.precision == "int8" and session.target.weights == "int8"
    assert weight_cache.cache_path(default_pair_paths[0]).exists()
    prompt = "Write a Python function that checks whether a string is a palindrome."
    result = compare(session, prompt, DecodeSettings(max_new_tokens=32, draft_length=3))
    assert result.speculative.stats.drafted > 0
    assert result.identical, result.divergence
    # Sensible output: the quantized model still writes the requested Python function.
    assert "def " in result.plain.text and "palindrome" in result.plain.text.lower(), result.plain.text
