"""A GGUF model built natively (engine.gguf) against the fp32 transformers model holding the
weights the file stands for (quantized as written, dequantized by gguf-py).

Tolerances: the GGUF linears quantize their inputs per block to int8 as llama.cpp does (about
0.4% of a block's largest value per element), so whole-model logits differ from the
dequantized fp32 model's by a few percent (stated below); with the inputs rounded the same way
the oracle's layers agree to fp32 rounding. Dense (F16) files involve no rounding at all.
"""
from __future__ import annotations

import pytest
import torch

from engine.gguf.loader import load_gguf
from engine.gguf.modules import DenseLinear, GgufEmbedding, GgufLinear
from engine.testing.tiny_gguf import build_model, dequantized_copy, write_gguf
from engine.testing.tiny_models import build_tokenizer
from kernels.gguf_linear.reference import input_block, quantize_input


def cpu_avx2_available() -> bool:
    from kernels.gguf_linear import cpu_avx2

    return cpu_avx2.available()

PROMPT = "def add(a, b):\n    return a + b  # The quick brown fox"
# Whole-model logits vs the dequantized fp32 model, relative L2 (measured 0.011-0.024 on these
# tame random models: input rounding through two layers).
LOGITS_REL_TOL = 0.05


# Tiny models: one thread (a parallel region costs more than the work); each test's own
# TANDEM_HOME comes from the root conftest.
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def _logits(model, tokenizer) -> torch.Tensor:
    ids = torch.tensor([tokenizer(PROMPT)["input_ids"]])
    with torch.no_grad():
        return model(ids).logits[0]


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3"])
@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q5_1"])
def test_logits_match_the_dequantized_model(tmp_path, tokenizer, arch, qtype):
    model = build_model(arch, len(tokenizer), init=0.1)
    path = write_gguf(model, tokenizer, tmp_path / f"{arch}.gguf", qtype)
    native = load_gguf(path)
    oracle = dequantized_copy(model, path)
    got, want = _logits(native.model, tokenizer), _logits(oracle, tokenizer)
    assert ((got - want).norm() / want.norm()).item() < LOGITS_REL_TOL
    assert native.quantization == qtype and native.label == f"As in the file ({qtype})"


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_dense_file_is_exact(tmp_path, tokenizer, arch):
    model = build_model(arch, len(tokenizer))
    path = write_gguf(model, tokenizer, tmp_path / "f16.gguf", "F16")
    native = load_gguf(path)
    assert torch.allclose(_logits(native.model, tokenizer), _logits(dequantized_copy(model, path), tokenizer), atol=1e-4)


@pytest.mark.parametrize("arch,qtype,hidden", [("llama", "Q4_0", 64), ("qwen2", "Q8_0", 64), ("qwen2", "Q4_K", 256),
                                               ("qwen2", "Q6_K", 256), ("qwen3", "Q5_K", 256)])
def test_every_layer_is_the_dequantized_layer_on_rounded_inputs(tmp_path, tokenizer, arch, qtype, hidden):
    """Each GgufLinear, on the very inputs it saw, equals the oracle's nn.Linear (transformers'
    row order: llama's Q/K permutation undone) applied to those inputs rounded per block."""
    model = build_model(arch, len(tokenizer), hidden=hidden)
    path = write_gguf(model, tokenizer, tmp_path / "m.gguf", qtype)
    native = load_gguf(path)
    oracle = dict(dequantized_copy(model, path).named_modules())
    seen: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    hooks = [m.register_forward_hook(lambda m, args, out, name=name: seen.__setitem__(name, (args[0], out)))
             for name, m in native.model.named_modules() if isinstance(m, GgufLinear)]
    _logits(native.model, tokenizer)
    for h in hooks:
        h.remove()
    assert len(seen) == 7 * 2 + 1  # every projection of both layers, and the LM head
    for name, (x, out) in seen.items():
        linear = oracle[name]
        block = input_block(native.model.get_submodule(name).weight_blocks.qtype)
        rows = x.reshape(-1, x.shape[-1])
        xq, dx, _ = quantize_input(rows, block)
        rounded = (xq.double().reshape(rows.shape[0], -1, block) * dx.double()[..., None]).reshape(rows.shape)
        want = rounded @ linear.weight.double().T + (0 if linear.bias is None else linear.bias.double())
        scale = want.abs().max().item()
        assert (out.reshape(want.shape).double() - want).abs().max().item() <= 1e-5 * scale + 1e-6, name


def test_modules_hold_the_file_not_copies(tmp_path, tokenizer):
    model = build_model("qwen2", len(tokenizer), tie_word_embeddings=True)
    path = write_gguf(model, tokenizer, tmp_path / "tied.gguf", "Q8_0")
    native = load_gguf(path)
    m = native.model
    assert not any(type(mod) is torch.nn.Linear or type(mod) is torch.nn.Embedding for mod in m.modules())
    assert all(p.device.type == "cpu" for p in m.parameters())
    embed, head = m.get_input_embeddings(), m.get_output_embeddings()
    assert isinstance(embed, GgufEmbedding) and isinstance(head, GgufLinear)
    # The tied head computes on the embedding's own bytes, both views of the mapped file.
    assert head.weight_blocks.raw.data_ptr() == embed.data.data_ptr()
    mapping = native.file._maps[0]
    inside = range(mapping.ctypes.data, mapping.ctypes.data + mapping.shape[0])
    assert embed.data.data_ptr() in inside
    assert m.model.layers[0].input_layernorm.weight.data_ptr() in inside  # F32 norms too
    assert m.model.layers[0].self_attn.q_proj.bias.data_ptr() in inside
    # An embedding lookup dequantizes the rows asked for and nothing else.
    ids = torch.tensor([[3, 7, 3]])
    assert torch.equal(embed(ids)[0, 0], embed(ids)[0, 2])
    assert torch.allclose(embed(ids)[0], dequantized_copy(model, path).get_input_embeddings()(ids)[0])


def test_dense_linear_is_batch_invariant(tmp_path, tokenizer):
    model = build_model("qwen2", len(tokenizer))
    native = load_gguf(write_gguf(model, tokenizer, tmp_path / "f16.gguf", "F16"))
    layer = native.model.model.layers[0].mlp.down_proj
    assert isinstance(layer, DenseLinear)
    x = torch.randn(9, layer.in_features)
    assert torch.equal(layer(x)[4:5], layer(x[4:5]))


def test_tokenizer_from_the_file_and_its_cache(tmp_path, tokenizer):
    model = build_model("qwen2", len(tokenizer))
    path = write_gguf(model, tokenizer, tmp_path / "tok.gguf", "Q8_0")
    first = load_gguf(path).tokenizer
    assert first.get_vocab() == tokenizer.get_vocab()
    assert first.chat_template == tokenizer.chat_template and first.eos_token == "<|im_end|>"
    # The file says "qwen2" pre-tokenization (Qwen's split pattern, not the tiny tokenizer's
    # GPT-2 one): the same ids where the two patterns split alike, and a lossless round trip.
    assert first("The quick brown fox jumps")["input_ids"] == tokenizer("The quick brown fox jumps")["input_ids"]
    assert first.decode(first(PROMPT)["input_ids"]) == PROMPT
    second = load_gguf(path).tokenizer  # from the cache entry this time
    assert second.get_vocab() == first.get_vocab() and second.chat_template == first.chat_template
    assert second(PROMPT)["input_ids"] == first(PROMPT)["input_ids"]


@pytest.mark.skipif(not cpu_avx2_available(), reason="no compiled GGUF tiles here")
def test_avx2_tiles_get_their_own_layout_where_memory_holds_it(tmp_path, tokenizer, monkeypatch, caplog):
    """On the AVX2 tiles (every x86 CPU runs them; VNNI ones are switched off here) a Q4_K /
    Q6_K model's matrices are laid out again for them, and its logits are bit for bit the file
    layout's. Where free memory would not hold that copy, the model computes from the mapped
    file, says so, and gives the same bits."""
    import psutil

    from kernels import gguf_linear
    from tests.kernels.isa import kernel_in_use

    model = build_model("qwen2", len(tokenizer), hidden=256)
    path = write_gguf(model, tokenizer, tmp_path / "k.gguf", "Q4_K")
    with kernel_in_use(gguf_linear, "cpu_avx2", "gguf_isa", "gguf_allow_vnni", "gguf_allow_amx"):
        packed = load_gguf(path)
        linears = [m for m in packed.model.modules() if isinstance(m, GgufLinear)]
        assert sum(m.type_name == "Q4_K" for m in linears) >= 14  # every projection of both layers
        assert all(m.weight_blocks.packed is not None for m in linears if m.type_name in ("Q4_K", "Q6_K"))
        want = _logits(packed.model, tokenizer)

        real = psutil.virtual_memory()
        monkeypatch.setattr(psutil, "virtual_memory", lambda: real._replace(available=64 * 2**20))
        with caplog.at_level("WARNING", logger="engine.gguf.model"):
            mapped = load_gguf(path)
        assert all(m.weight_blocks.packed is None for m in mapped.model.modules() if isinstance(m, GgufLinear))
        assert "computing from the mapped file instead" in caplog.text
        assert torch.equal(_logits(mapped.model, tokenizer), want)
