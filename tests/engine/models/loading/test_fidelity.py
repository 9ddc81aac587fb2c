"""The fidelity benchmark's measures compute what they claim, its reference holds exactly the
file's dequantized weights, and `tandem fidelity` runs end to end on a tiny GGUF file."""
from __future__ import annotations

import json
import math

import pytest
import torch

from engine.bench.fidelity import (
    Agreement,
    build_reference,
    compare_weights,
    kl_divergence,
    perplexity,
    score_candidate,
    top1_agreement,
)
from engine.cli import main
from engine.gguf.dequantized import load_dequantized
from engine.models.loading.default_pair import convert_gguf
from engine.testing.tiny_gguf import build_model, dequantized_copy, write_gguf
from engine.testing.tiny_models import build_tokenizer, perturbed_copy

PROMPTS = [{"id": "code", "category": "code", "prompt": "def add(a, b):"},
           {"id": "prose", "category": "prose", "prompt": "The quick brown fox"}]
TEXT = "def add(a, b):\n    return a + b\n\nThe quick brown fox jumps over the lazy dog."


# Tiny models: one thread (a parallel region costs more than the work); each test's own
# TANDEM_HOME comes from the root conftest.
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory, tokenizer):
    """(gguf path, its converted bf16 folder, the model it was written from)."""
    folder = tmp_path_factory.mktemp("fidelity")
    model = build_model("qwen2", len(tokenizer), init=0.1)
    path = write_gguf(model, tokenizer, folder / "tiny-q8_0.gguf", "Q8_0")
    return path, convert_gguf(path, folder / "converted"), model


def test_measures_on_known_distributions():
    ref = torch.log_softmax(torch.tensor([[2.0, 0.0, -1.0], [0.0, 3.0, 0.0]]), -1)
    cand = torch.log_softmax(torch.tensor([[0.0, 2.0, -1.0], [0.0, 3.0, 0.5]]), -1)
    assert top1_agreement(ref, cand).tolist() == [False, True]
    p, q = ref.double().exp(), cand.double().exp()
    want = [sum(p[t, i] * math.log(p[t, i] / q[t, i]) for i in range(3)) for t in range(2)]
    assert torch.allclose(kl_divergence(ref, cand), torch.tensor(want, dtype=torch.float64))
    assert kl_divergence(ref, ref).abs().max() == 0
    # Uniform over 3 tokens: perplexity 3 whatever the text.
    assert perplexity(torch.full((4, 3), -math.log(3)), [0, 2, 1, 1]) == pytest.approx(3.0)
    assert perplexity(ref, [0, 1]) == pytest.approx(math.exp(-(ref[0, 0] + ref[1, 1]).item() / 2))
    pooled = Agreement.pooled([torch.tensor([True, False]), torch.tensor([True, True])],
                              [torch.tensor([0.1, 0.3]), torch.tensor([0.0, 0.0])])
    assert pooled == Agreement(4, 0.75, pytest.approx(0.1))


def test_reference_holds_exactly_the_files_dequantized_weights(tiny_file):
    path, _, model = tiny_file
    reference, _ = load_dequantized(path)
    oracle = dequantized_copy(model, path)
    got, want = reference.state_dict(), oracle.state_dict()
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_identical_model_agrees_fully_and_a_perturbed_one_less(tiny_file, tokenizer):
    path, _, _ = tiny_file
    reference_model, _ = load_dequantized(path)
    reference = build_reference(reference_model, tokenizer, PROMPTS, 12, TEXT)
    assert [len(s.generated) for s in reference.sequences] == [12, 12]
    same = score_candidate(reference_model, reference)
    assert same["prompts"] == {"positions": 24, "top1_agreement": 1.0, "mean_kl": 0.0}
    assert same["text"]["perplexity"] == pytest.approx(reference.text_perplexity)
    assert same["text"]["top1_agreement"] == 1.0 and same["text"]["mean_kl"] == 0.0
    other = score_candidate(perturbed_copy(reference_model, 0.2, seed=3), reference)
    assert other["prompts"]["top1_agreement"] < 1.0 and other["prompts"]["mean_kl"] > 1e-3
    assert other["text"]["perplexity"] != pytest.approx(reference.text_perplexity)
    assert set(other["by_category"]) == {"code", "prose"}


def test_bf16_conversion_is_the_files_values_rounded(tiny_file):
    path, folder, _ = tiny_file
    reference, _ = load_dequantized(path)
    found = compare_weights(reference, folder)
    assert found["dtypes"] == ["bfloat16"] and found["equals_rounded_reference"]
    # Q8_0 values d*q (fp16 d, 8-bit q) mostly need more than bf16's 8 significant bits.
    assert not found["lossless"] and found["share_unchanged"] < 0.5


def test_cli_end_to_end(tiny_file, tmp_path, capsys):
    path, folder, _ = tiny_file
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    out = tmp_path / "fidelity.json"
    assert main(["fidelity", "--gguf", str(path), "--folder", str(folder), "--prompts", str(prompts), "--text", str(text),
                 "--new-tokens", "6", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert list(report["candidates"]) == ["file", "file-kv32", "int8", "int4", "bf16", "fp32"]
    for c in report["candidates"].values():
        assert c["prompts"]["positions"] == 12 and 0 <= c["prompts"]["top1_agreement"] <= 1 and c["prompts"]["mean_kl"] >= 0
    assert report["candidates"]["file"]["quantization"] == "Q8_0"
    # The file as the engine runs it (GgufRunner), its cache in fp16, and the same in fp32: the
    # 16-bit cache costs a little agreement with the reference, never a lot.
    file, kv32 = report["candidates"]["file"], report["candidates"]["file-kv32"]
    assert (file["kv_cache"], kv32["kv_cache"]) == ("float16", "float32")
    assert file["prompts"]["mean_kl"] != kv32["prompts"]["mean_kl"]
    assert abs(file["text"]["perplexity"] - kv32["text"]["perplexity"]) < 0.01 * kv32["text"]["perplexity"]
    assert report["converted_weights"]["equals_rounded_reference"]
    printed = capsys.readouterr().out
    assert "file (Q8_0)" in printed and "wrote" in printed


def test_cli_refuses_bad_input_before_loading(tiny_file, tmp_path, capsys):
    path, _, _ = tiny_file
    assert main(["fidelity", "--gguf", str(path), "--candidates", "int8", "--json", str(tmp_path / "o.json")]) == 2
    assert "--folder" in capsys.readouterr().err
    assert main(["fidelity", "--gguf", str(path), "--candidates", "bf17", "--json", str(tmp_path / "o.json")]) == 2
    assert main(["fidelity", "--gguf", str(path), "--new-tokens", "0"]) == 2
