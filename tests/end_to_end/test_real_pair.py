"""End to end on the real default pair (Qwen2.5-Coder 1.5B target, 0.5B drafter).

Slow: needs the set-up to have installed and converted the pair (make setup). Runs in CI.
"""
import os
import subprocess
import sys

import pytest

from engine.core.settings import DecodeSettings
from engine.session.compare import compare, drain
from engine.session.session import Session

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def paths(default_pair_paths):
    return default_pair_paths


@pytest.fixture(scope="module")
def exact_session(paths):
    return Session.load(paths[0], paths[1], precision="fp32", device="cpu")


@pytest.mark.parametrize(
    "prompt",
    [
        "Write a Python function that checks whether a string is a palindrome.",
        "Tell me a two-sentence story about a cat.",
    ],
)
def test_exact_mode_speculation_is_token_identical(exact_session, prompt):
    settings = DecodeSettings(max_new_tokens=24, draft_length=3)  # fixed k: always drafts
    result = compare(exact_session, prompt, settings, drafter="model")
    assert result.identical, result.divergence
    assert result.speculative.stats.drafted > 0
    assert result.speculative.stats.accepted > 0  # the real pair agrees often


def test_prompt_lookup_on_a_rewrite_is_identical_and_accepts(exact_session):
    prompt = ("Return this code unchanged, with the variable x renamed to total:\n"
              "def f(values):\n    x = 0\n    for v in values:\n        x += v\n    return x\n")
    result = compare(exact_session, prompt, DecodeSettings(max_new_tokens=32, draft_length=4), drafter="lookup")
    assert result.identical
    assert result.speculative.stats.accepted >= 8


def test_sampling_runs_on_the_real_pair(exact_session):
    ids = exact_session.encode("Name three colours.")
    result = drain(exact_session.speculative(ids, DecodeSettings(mode="sample", temperature=0.8, top_p=0.9, max_new_tokens=12, draft_length=3)))
    assert result.stats.new_tokens > 0 and result.text.strip()


@pytest.fixture(scope="module")
def fast_session(paths):
    return Session.load(paths[0], paths[1], precision="bf16", device="cpu")


def test_fast_mode_speculation_is_token_identical(fast_session):
    """bf16 too: with batch-invariant linears and attention a verification pass gives the same
    bits as one-token steps. Before the attention kernel, plain and speculative output of this
    prompt parted at token 19 (a near-tie flipped)."""
    prompt = "Write a short story about a lighthouse keeper who finds a message in a bottle."
    result = compare(fast_session, prompt, DecodeSettings(max_new_tokens=48))
    assert result.speculative.stats.drafted > 0
    assert result.identical, result.divergence


def test_cli_compare_fast_mode_reports_speed_and_identity(paths):
    env = dict(os.environ)
    out = subprocess.run(
        [sys.executable, "-m", "engine", "compare", "Write hello world in Python.", "--max-new-tokens", "16"],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert out.returncode == 0, out.stderr
    assert "tokens/sec" in out.stdout and "speedup:" in out.stdout
    assert "outputs: identical" in out.stdout or "outputs: differ from new token" in out.stdout
    # A library's shutdown report (triton 3.9's nanobind bindings print ~30 lines of "leaked
    # function" at every exit once torch has probed it) is noise at the end of a user's command.
    assert "leaked" not in out.stderr, out.stderr[-2000:]
