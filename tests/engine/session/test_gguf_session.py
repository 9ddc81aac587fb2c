"""GGUF files as a session's target and drafter (precision "file"): greedy speculation is
token-identical to plain decoding of the same file, and bad inputs fail with a message that
names the file (through the CLI too: no traceback)."""
from __future__ import annotations

import pytest
import torch

from engine.cli import main as cli_main
from engine.core.settings import DecodeSettings, DrafterOptions
from engine.drafters import DrafterMismatch, gguf_head
from engine.session.compare import compare
from engine.session.session import Session
from engine.testing.tiny_gguf import build_model, write_gguf, write_gguf_pair
from engine.testing.tiny_models import build_tokenizer

PROMPTS = ["def add(a, b):", "The quick brown fox", "for i in range(10):\n"]


# Tiny models: one thread (a parallel region costs more than the work); each test's own
# TANDEM_HOME comes from the root conftest.
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A 4-layer Q4_0 target and a Q8_0 drafter (the target's weights, perturbed)."""
    return write_gguf_pair(tmp_path_factory.mktemp("pair"), layers=4)


@pytest.mark.parametrize("drafter_precision", ["auto", "fp32"])
def test_greedy_speculation_equals_plain_decoding_of_the_file(pair, drafter_precision):
    """The drafter re-quantized to int4 layers ("auto" next to a GGUF target, where the kernels
    run) or on its file's own blocks (any 16 / 32-bit choice)."""
    from engine.models.loading.loader import int4_available, int8_available

    session = Session.load(pair[0], pair[1], precision="file", drafter_options=DrafterOptions(precision=drafter_precision))
    assert session.precision == "file" and session.target.quantization == "Q4_0"
    requantized = drafter_precision == "auto" and int8_available() and int4_available()
    assert session.drafter_model.weights == ("int4" if requantized else "file")
    assert session.drafter_model.quantization == "Q8_0"
    assert session.target.model.config._attn_implementation == "tandem_batch_invariant"
    accepted = 0
    for prompt in PROMPTS[:2]:
        for k in (None, 4):
            result = compare(session, prompt, DecodeSettings(max_new_tokens=32, draft_length=k))
            assert result.speculative.token_ids == result.plain.token_ids, (prompt, k)
            accepted += result.speculative.stats.accepted
    assert accepted > 0  # the drafter's proposals were really verified, not all rejected


def test_gguf_drafter_drafts_from_a_pruned_head_of_its_rows(pair, monkeypatch):
    monkeypatch.setattr(gguf_head, "_CHUNK", 50)  # several chunks even for the tiny vocabulary
    session = Session.load(pair[0], pair[1], precision="file")
    head = session.model_drafter.head
    assert isinstance(head, gguf_head.GgufReducedHead)
    lm_head = session.drafter_model.model.get_output_embeddings()
    hidden = torch.randn(3, lm_head.in_features)
    # Its rows are the file's, rounded to int8 per row: logits within that rounding of the full head's.
    full = lm_head(hidden)[:, head.ids]
    assert torch.allclose(head.logits(hidden), full, atol=0.02 * full.abs().max().item())
    full_options = Session.load(pair[0], pair[1], precision="file", drafter_options=DrafterOptions(head="full"))
    assert full_options.model_drafter.head is None  # drafts from the file's own head


def test_folder_drafter_next_to_a_gguf_target(tmp_path, pair):
    """A GGUF target with a drafter folder (transformers format): the drafter's own precision."""
    tokenizer = build_tokenizer()
    drafter = build_model("qwen2", len(tokenizer), layers=2, seed=3)
    drafter.save_pretrained(tmp_path / "drafter")
    tokenizer.save_pretrained(tmp_path / "drafter")
    session = Session.load(pair[0], tmp_path / "drafter", precision="file")
    result = compare(session, PROMPTS[0], DecodeSettings(max_new_tokens=24, draft_length=3))
    assert result.speculative.token_ids == result.plain.token_ids
    # Next to a GGUF target's cheap step the int4 drafter is the fastest one (loading.drafter_weights).
    from engine.models.loading.loader import int4_available, int8_available

    if int8_available() and int4_available():
        assert session.drafter_model.weights == "int4"


def test_drafter_with_another_vocabulary_is_refused(tmp_path, pair):
    other_tokenizer = build_tokenizer(vocab_size=300)
    other = write_gguf(build_model("qwen2", len(other_tokenizer)), other_tokenizer, tmp_path / "other-vocab.gguf")
    with pytest.raises(DrafterMismatch, match=r"other-vocab\.gguf does not share target-q4_0\.gguf's tokenizer"):
        Session.load(pair[0], other, precision="file")


def test_precision_must_match_the_kind_of_target(tmp_path, pair):
    with pytest.raises(ValueError, match=r"target-q4_0\.gguf is a GGUF file: it runs at precision 'file'"):
        Session.load(pair[0], None, precision="bf16")
    tokenizer = build_tokenizer()
    build_model("qwen2", len(tokenizer)).save_pretrained(tmp_path / "folder")
    tokenizer.save_pretrained(tmp_path / "folder")
    with pytest.raises(ValueError, match="precision 'file' runs a GGUF file's own quantization, and folder is not"):
        Session.load(tmp_path / "folder", None, precision="file")


def test_cli_compare_on_gguf_files(pair, capsys):
    # No --precision: a .gguf target runs its own quantization.
    code = cli_main(["compare", "--target", str(pair[0]), "--drafter-model", str(pair[1]), "--max-new-tokens", "12",
                     "--draft-length", "3", PROMPTS[0]])
    out = capsys.readouterr().out
    assert code == 0 and "outputs: identical" in out and "file)" in out


@pytest.mark.parametrize("damage", ["truncate", "magic"])
def test_cli_names_a_bad_file(tmp_path, pair, capsys, damage):
    bad = tmp_path / f"{damage}.gguf"
    data = pair[0].read_bytes()
    bad.write_bytes(data[: len(data) // 2] if damage == "truncate" else b"GGML" + data[4:])
    code = cli_main(["compare", "--target", str(bad), "--drafter-model", str(pair[1]), "--max-new-tokens", "4", "hi"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert f"tandem: error: {bad.name} is " + ("truncated" if damage == "truncate" else "not a GGUF file") in err
