"""The default pair's GGUF files run natively (precision "file"): real weights, minutes.

Skipped where the files are not assembled (``tandem setup`` writes them to the cache dir).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.core.paths import cache_dir
from engine.core.settings import DecodeSettings
from engine.models.loading import default_pair

pytestmark = pytest.mark.slow

CODE_PROMPT = "Write a Python function that returns the n-th Fibonacci number."


def _gguf(spec: default_pair.GgufSpec) -> Path:
    path = cache_dir() / "gguf" / spec.filename
    if not path.exists() or path.stat().st_size != spec.size:
        pytest.skip(f"{spec.filename} is not assembled here (run tandem setup)")
    return path


@pytest.fixture(scope="module")
def session():
    from engine.session.session import Session

    return Session.load(_gguf(default_pair.TARGET), _gguf(default_pair.DRAFTER), precision="file")


def test_the_files_own_quantization_with_token_identical_speculation(session):
    from engine.session.compare import compare

    assert session.precision == "file" and session.target.quantization == "Q4_K_M"
    assert session.drafter_model.quantization == "mostly Q5_0"  # its file type says Q4_K_M; its tensors don't
    assert not any(type(m) is torch.nn.Linear for m in session.target.model.modules())
    result = compare(session, CODE_PROMPT, DecodeSettings(max_new_tokens=48, draft_length=4))
    assert result.speculative.token_ids == result.plain.token_ids
    assert result.speculative.stats.accepted > 10 and "def " in result.plain.text


def test_tokenizer_is_the_converted_folders(session):
    found = default_pair.installed_paths()
    if found is None:
        pytest.skip("the converted default pair is not installed")
    from transformers import AutoTokenizer

    converted = AutoTokenizer.from_pretrained(found[0])
    assert session.tokenizer.get_vocab() == converted.get_vocab()
    assert session.encode(CODE_PROMPT) == list(converted.apply_chat_template(
        [{"role": "user", "content": CODE_PROMPT}], add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"])


_PROBE = """
import json, sys
from pathlib import Path
from engine.bench.memory_probe import measure
print(json.dumps(measure(Path(sys.argv[1]), None, "file", 256, 8, "cpu")))
"""


def _packed_bytes(path: Path) -> int:
    """At most what the CPU kernels' own layout of ``path``'s matrices takes where their AVX2 tiles
    run (engine.gguf.model's rule), 0 elsewhere. The untied input embedding stays the file's
    (looked up row by row)."""
    from engine.gguf.model import packed_copy_bytes
    from engine.gguf.reader import open_gguf

    file = open_gguf(path)
    return packed_copy_bytes(file, [name for name in file.tensors if name != "token_embd.weight"])


def test_memory_holds_the_file_mapped_and_no_copy_of_it():
    """In a fresh process: loading reads almost none of the weights (they are mapped), and
    decoding keeps them as the file's pages, with no weights-sized anonymous copy; but for the
    tiles' own layout of Q4_K / Q6_K where the AVX2 or VNNI tiles run, which replaces the file's pages
    of those matrices (they are released after the copy is made)."""
    target = _gguf(default_pair.TARGET)
    run = subprocess.run([sys.executable, "-c", _PROBE, str(target)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    size = target.stat().st_size
    packed = _packed_bytes(target)  # the layout's copy
    # The sampler's peaks, not ru_maxrss: Linux carries a parent's high-water mark over exec (this
    # test process may hold the pair already). Loading maps the file; it reads almost none of it
    # (what it reads to lay out again, it releases).
    assert report["load_peak_anon"] - report["anon_runtime"] <= 0.5 * size + packed, report
    assert report["file_loaded"] <= 0.5 * size, report
    assert report["mapped_end"].get(target.name, 0) <= size, report
    # A bf16 copy of the weights would be ~3 GB, an int8 one ~1.5 GB: anonymous memory grows by
    # the tokenizer, activations and K/V only (and the layout's copy).
    assert report["generate_peak_anon"] - report["anon_runtime"] <= 0.5 * size + packed, report
    # The copy is made in a fresh process (where free memory holds it, engine.gguf.model: asked
    # only with room to spare, so the child's own check cannot come out otherwise).
    import psutil

    from engine.gguf.resident import COPY_HEADROOM

    if packed and psutil.virtual_memory().available > 2 * (packed + COPY_HEADROOM):
        assert report["generate_peak_anon"] - report["anon_runtime"] >= 0.9 * packed, report
