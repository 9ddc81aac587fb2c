"""Local GGUF models as picker rows (engine.library.fit_rows): the file is the variant, the
source names the app it came from, the drafter the library matched is budgeted."""
from __future__ import annotations

from engine.library import list_local_models
from engine.library.fit_rows import (
    LOCAL_ID_PREFIX,
    architecture_from_header,
    local_fits,
)
from engine.library.header import read_header
from engine.models.planning.hardware import Hardware
from tests.engine.library.conftest import place_llama_cpp, place_lmstudio, place_ollama

HARDWARE = Hardware.from_profile({"ram_gb": 16, "cpu_cores": 4})


def test_local_models_become_fit_rows(ggufs, isolated_home, tmp_path):
    place_lmstudio(isolated_home, ggufs["target"], "tiny-org", "tiny-target-GGUF")
    place_ollama(tmp_path / "ollama", ggufs["drafter"], "tiny-drafter")
    place_llama_cpp(tmp_path / "llama-cache", ggufs["other_vocab"], "tiny-org", "other-vocab-GGUF")
    place_llama_cpp(tmp_path / "llama-cache", ggufs["mamba"], "tiny-org", "tiny-mamba-GGUF")
    models = list_local_models()
    rows = {r.model.name: r for r in local_fits(models, HARDWARE)}
    # The mamba file cannot run: no row (the library lists it with its problem).
    assert set(rows) == {"tiny-org/tiny-target-GGUF/tiny-target-Q4_0", "tiny-drafter:latest",
                         "tiny-org/other-vocab-GGUF/other-vocab-Q8_0"}
    target = rows["tiny-org/tiny-target-GGUF/tiny-target-Q4_0"].fit
    assert target.entry.id.startswith(LOCAL_ID_PREFIX)
    assert (target.source, target.variant, target.precision) == ("lmstudio", "Q4_0", "file")
    assert target.file_bytes == ggufs["target"].stat().st_size
    assert target.gguf.size_source == "file"
    # Its drafter is the Ollama pull of the same vocabulary, budgeted from that file.
    assert target.entry.drafter_kind == "draft_model" and target.entry.drafter_repo == "tiny-drafter:latest"
    assert target.drafter_gguf is not None and target.drafter_gguf.file_bytes == ggufs["drafter"].stat().st_size
    assert target.estimate.drafter > 0 and target.fit == "cpu"
    other = rows["tiny-org/other-vocab-GGUF/other-vocab-Q8_0"]
    assert (other.fit.source, other.fit.entry.drafter_kind) == ("llama.cpp", "lookup")
    assert other.model.drafting.kind == "lookup" and other.model.drafting.refusals
    assert rows["tiny-drafter:latest"].fit.source == "ollama"


def test_architecture_from_header_matches_the_file(ggufs):
    arch = architecture_from_header(ggufs["target"])
    meta = read_header(ggufs["target"]).metadata
    assert (arch.model_type, arch.num_layers, arch.hidden_size) == ("qwen2", meta["qwen2.block_count"],
                                                                  meta["qwen2.embedding_length"])
    assert (arch.kv_heads, arch.head_dim, arch.max_context) == (2, 16, 512)
    assert not arch.conservative
