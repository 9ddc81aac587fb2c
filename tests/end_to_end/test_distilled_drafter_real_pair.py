"""A drafter distilled on the real default target (a short run), then drafting for it: the
target's GGUF runner keeps the drafter's layer states, the int8 EAGLE-3 layer drafts, and the
output is the target's own. Real weights, a minute or so."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.core.paths import cache_dir
from engine.core.settings import DecodeSettings
from engine.models.loading import default_pair

pytestmark = pytest.mark.slow

PROMPTS = ["Write a Python function that reverses a string.", "Explain what a Python list is.",
           "Write a function that sums a list of numbers.", "Describe a cat in two sentences."]


def _gguf(spec: default_pair.GgufSpec) -> Path:
    path = cache_dir() / "gguf" / spec.filename
    if not path.exists() or path.stat().st_size != spec.size:
        pytest.skip(f"{spec.filename} is not assembled here (run tandem setup)")
    return path


def test_a_drafter_distilled_on_the_real_target_drafts_losslessly(tmp_path):
    from engine.distill.distill import DistillSettings, distill
    from engine.drafters.eagle3 import Eagle3Drafter
    from engine.models.runners.gguf_runner import GgufRunner
    from engine.session.compare import compare
    from engine.session.session import Session

    target = _gguf(default_pair.TARGET)
    session = Session.load(target, None, precision="file")
    out = tmp_path / "drafter"
    settings = DistillSettings(minutes=10.0, reply_tokens=16, max_steps=20, draft_vocab=2048)
    events = list(distill(session.layer_states_runner, session.target.model, session.tokenizer, session.eos_ids,
                          session.target.name, [session.encode(p) for p in PROMPTS], out, settings))
    assert events[-1].phase == "done"
    record = json.loads((out / "config.json").read_text())["tandem_training"]
    assert record["texts"] == len(PROMPTS) and 0 < record["steps"] <= 20  # the best scoring step saved

    paired = Session.load(target, out, precision="file")
    drafter = paired.drafter("model")
    assert isinstance(drafter.model, Eagle3Drafter) and isinstance(paired.target_runner(drafter), GgufRunner)
    for k in (3, None):
        result = compare(paired, "Write a Python function that returns the n-th Fibonacci number.",
                         DecodeSettings(max_new_tokens=32, draft_length=k))
        assert result.speculative.token_ids == result.plain.token_ids
        assert result.speculative.stats.drafted > 0 or k is None
