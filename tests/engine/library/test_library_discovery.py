"""Models found in LM Studio's, llama.cpp's and Ollama's folders (read only), each with its
drafter or the reason none fits; one found pair loads through the engine and greedy
speculation is token-identical to plain decoding."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from engine.core.settings import DecodeSettings
from engine.library import list_local_models, loadable_path
from engine.library.header import read_header
from engine.library.vocab import first_difference
from tests.engine.library.conftest import (
    place_llama_cpp,
    place_lmstudio,
    place_ollama,
    snapshot,
)

TARGET = "tiny-org/tiny-target-GGUF/tiny-target-Q4_0"
OTHER = "tiny-org/other-vocab-GGUF/other-vocab-Q8_0"
MAMBA = "tiny-org/tiny-mamba-GGUF/tiny-mamba-Q8_0"


@pytest.fixture
def stores(ggufs, isolated_home, tmp_path):
    """Target in LM Studio's folder (with a vision projector beside it), the drafter pulled by
    Ollama, a model of another vocabulary and one of an architecture Tandem cannot run in
    llama.cpp's cache; a split model in LM Studio's older folder."""
    place_lmstudio(isolated_home, ggufs["target"], "tiny-org", "tiny-target-GGUF")
    projector = isolated_home / ".lmstudio" / "models" / "tiny-org" / "tiny-target-GGUF" / "mmproj-tiny-f16.gguf"
    shutil.copy(ggufs["mamba"], projector)
    place_ollama(tmp_path / "ollama", ggufs["drafter"], "tiny-drafter")
    place_llama_cpp(tmp_path / "llama-cache", ggufs["other_vocab"], "tiny-org", "other-vocab-GGUF")
    place_llama_cpp(tmp_path / "llama-cache", ggufs["mamba"], "tiny-org", "tiny-mamba-GGUF")
    old = isolated_home / ".cache" / "lm-studio" / "models" / "tiny-org" / "tiny-split-GGUF"
    old.mkdir(parents=True)
    for part in ggufs["split"].parent.glob("*.gguf"):
        shutil.copy(part, old / part.name)
    return [isolated_home / ".lmstudio", isolated_home / ".cache" / "lm-studio", tmp_path / "ollama", tmp_path / "llama-cache"]


def test_discovers_every_store_and_matches_drafters(stores, ggufs):
    before = snapshot(*stores)
    models = {m.name: m for m in list_local_models()}
    assert snapshot(*stores) == before  # nothing written into the other apps' folders
    assert set(models) == {TARGET, "tiny-org/tiny-split-GGUF/tiny-split-Q8_0", "tiny-drafter:latest", OTHER, MAMBA}
    sources = {name: m.source for name, m in models.items()}
    assert sources == {TARGET: "lmstudio", "tiny-org/tiny-split-GGUF/tiny-split-Q8_0": "lmstudio",
                       "tiny-drafter:latest": "ollama", OTHER: "llama.cpp", MAMBA: "llama.cpp"}
    target, drafter = models[TARGET], models["tiny-drafter:latest"]
    assert (target.architecture, target.quant, target.context_length) == ("qwen2", "Q4_0", 512)
    assert target.file_bytes == ggufs["target"].stat().st_size
    assert drafter.path.name.startswith("sha256-") and drafter.quant == "Q8_0"
    assert len(models["tiny-org/tiny-split-GGUF/tiny-split-Q8_0"].parts) == 3

    # The target drafts with the smallest same-vocabulary model; the others are refusals, with why.
    assert target.drafting.kind == "model" and target.drafting.drafter.name == "tiny-drafter:latest"
    assert target.drafting.drafter.source == "ollama"
    why = {r.candidate.name: r.why for r in target.drafting.refusals}
    assert why == {OTHER: "vocabulary", MAMBA: "architecture", "tiny-org/tiny-split-GGUF/tiny-split-Q8_0": "larger"}
    # The drafter itself has nothing smaller to draft for it.
    assert drafter.drafting.kind == "lookup" and drafter.drafting.reason.startswith("drafter larger than target: ")
    # Another vocabulary: the reason names the closest candidate and the first differing id.
    ours, theirs = read_header(ggufs["other_vocab"]).tokens, read_header(ggufs["target"]).tokens
    expected = first_difference(ours, theirs).token_id
    other = models[OTHER].drafting
    assert other.kind == "lookup"
    assert other.reason.startswith("no installed drafter shares this vocabulary: ")
    assert f"differs at token id {expected:,}" in other.reason
    refusal = next(r for r in other.refusals if r.candidate.name == TARGET)
    assert (refusal.why, refusal.token_id) == ("vocabulary", expected)
    # An architecture Tandem cannot run: listed, with the loader's reason, and no drafting.
    assert models[MAMBA].problem.startswith("tiny-org_tiny-mamba-GGUF_tiny-mamba-Q8_0.gguf is a 'mamba' model; "
                                            "Tandem runs GGUF files of these architectures: ")
    assert models[MAMBA].drafting is None and not models[MAMBA].runnable
    json.dumps([m.to_dict() for m in models.values()])  # rows for `tandem models --json`


def test_found_pair_runs_and_speculation_is_lossless(stores):
    from engine.session.compare import compare
    from engine.session.session import Session

    target = next(m for m in list_local_models() if m.name == TARGET)
    drafter_path = loadable_path(target.drafting.drafter)  # an Ollama blob: a .gguf link in Tandem's cache
    assert drafter_path.suffix == ".gguf" and drafter_path.resolve() == target.drafting.drafter.path.resolve()
    assert os.environ["TANDEM_HOME"] in str(drafter_path)
    session = Session.load(loadable_path(target), drafter_path, "file", "cpu")
    accepted = 0
    for prompt in ("def add(a, b):", "The quick brown fox"):
        result = compare(session, prompt, DecodeSettings(max_new_tokens=24, draft_length=4))
        assert result.speculative.token_ids == result.plain.token_ids, prompt
        accepted += result.speculative.stats.accepted
    assert accepted > 0  # the found drafter's proposals were really verified (and some kept)


def test_listing_reads_each_header_once(stores, monkeypatch):
    from engine.library import summaries

    list_local_models()
    calls = []
    monkeypatch.setattr(summaries, "read_header", lambda *a, **k: calls.append(a) or pytest.fail("header read again"))
    assert len(list_local_models()) == 5 and calls == []


def test_converted_folder_drafts_for_a_gguf_target(ggufs, tmp_path):
    """Tandem's converted models (<cache>/models/<name>) are drafter candidates; a larger
    same-vocabulary GGUF file is refused as larger."""
    from engine.core.paths import cache_dir
    from engine.library import import_model
    from engine.testing.tiny_gguf import build_model
    from engine.testing.tiny_models import build_tokenizer

    folder = cache_dir() / "models" / "tiny-converted"
    tokenizer = build_tokenizer()
    build_model("qwen2", len(tokenizer), layers=1).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "tandem-converted.json").write_text("{}")
    import_model(shutil.copy(ggufs["drafter"], tmp_path / ggufs["drafter"].name))
    import_model(shutil.copy(ggufs["target"], tmp_path / ggufs["target"].name))
    models = {m.name: m for m in list_local_models()}
    for name in ("tiny-target-Q4_0", "tiny-drafter-Q8_0"):
        drafting = models[name].drafting
        assert drafting.kind == "model" and drafting.drafter.name == "tiny-converted", drafting
        assert drafting.drafter.kind == "folder" and drafting.drafter.source == "tandem"
    refusals = {r.candidate.name: r.why for r in models["tiny-drafter-Q8_0"].drafting.refusals}
    assert refusals == {"tiny-target-Q4_0": "larger"}
