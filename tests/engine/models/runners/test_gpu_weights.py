"""4-bit weights through torch's int4 kernels (engine/quant/gpu_weights.py), run here on the CPU
(_weight_int4pack_mm_for_cpu): the model computes its dequantized weights, speculation on it
equals its plain decoding, given codes are used as given, and the bytes it holds are what the
memory fit budgets. On a GPU / Mac scripts/gpu_check.sh runs the device parity."""
import copy

import pytest
import torch

from engine.models.planning.architecture import architecture_from_config
from engine.models.planning.memory_fit import INT4PACK_BYTES_PER_WEIGHT, int4_device_bytes
from engine.models.runners.invariant_attention import use_batch_invariant_attention
from engine.models.runners.runner import ModelRunner
from engine.quant.gpu_weights import Int4PackLinear, Int8Embedding, Int8PackLinear, to_4bit_device_weights
from kernels.int4pack import AffineInt4, reference
from tests.engine.helpers import assert_speculation_matches_plain

PROMPTS = ["def add(a, b):", "The quick brown fox", "for i in range(10):\n    print(i)"]
DTYPE = torch.bfloat16


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py says why


@pytest.fixture(scope="module")
def converted(tiny_pair):
    """(tokenizer, 4-bit target in bf16, what the conversion reported, the bf16 original)."""
    tokenizer, target, _ = tiny_pair
    original = copy.deepcopy(target).to(DTYPE)
    model = copy.deepcopy(original)
    report = to_4bit_device_weights(model, "cpu")
    # As load_model does for every CPU target: one-row and k-row attention agree bit for bit.
    assert use_batch_invariant_attention(model)
    return tokenizer, model, report, original


def dequantized_copy(original: torch.nn.Module, dtype: torch.dtype = DTYPE) -> torch.nn.Module:
    """``original`` with the weights a conversion at ``dtype`` stands for, in fp32: the same
    deterministic quantization (reference.quantize / quantize_int8) dequantized."""
    model = copy.deepcopy(original).float()
    with torch.no_grad():
        for name, module in original.named_modules():
            if not isinstance(module, torch.nn.Linear):
                continue
            n, k = module.weight.shape
            if module is original.lm_head or not reference.supports(n, k):
                q, s = reference.quantize_int8(module.weight, dtype)
                weight = reference.dequantize_int8(q, s)
            else:
                w = reference.quantize(module.weight, dtype)
                weight = reference.dequantize(w.codes, reference.scales_and_zeros(w.scale, w.offset, dtype))
            model.get_submodule(name).weight.copy_(weight)
        q, s = reference.quantize_int8(original.get_input_embeddings().weight, dtype)
        model.get_input_embeddings().weight.copy_(reference.dequantize_int8(q, s))
    return model


def test_every_layer_is_converted_where_the_kernels_take_it(converted):
    _, model, report, _ = converted
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
    int4 = [m for m in model.modules() if isinstance(m, Int4PackLinear)]
    assert len(int4) == report.int4_layers == 4 * 7  # q k v o gate up down in each of 4 layers
    assert isinstance(model.lm_head, Int8PackLinear)  # the head at 8 bits, as Q4_K_M keeps it at 6
    assert isinstance(model.get_input_embeddings(), Int8Embedding)
    assert report.kept_layers == () and report.int8_layers == 1
    assert report.int4_bits_per_weight == 8 * INT4PACK_BYTES_PER_WEIGHT == 5.0
    assert all(m.scales_zeros.dtype is DTYPE for m in int4)


@pytest.mark.parametrize("dtype, bound", [(torch.float32, 1e-4), (torch.bfloat16, 0.08)])
def test_the_model_computes_its_dequantized_weights(tiny_pair, dtype, bound):
    """Against the fp32 model holding the very weights the codes stand for: in fp32 (the CPU op
    takes it) only summation order remains; in bf16 the arithmetic of activations, norms and
    attention (on this random 4-layer net with its wide init bf16 alone is 2-4% off fp32:
    measured 0.023 for the float model, 0.040 for the dequantized one). Against the float
    model the 4-bit rounding itself shows, which this net amplifies."""
    tokenizer, target, _ = tiny_pair
    original = copy.deepcopy(target).to(dtype)
    model = copy.deepcopy(original)
    to_4bit_device_weights(model, "cpu", dtype=dtype)
    use_batch_invariant_attention(model)
    ids = tokenizer("def add(a, b):\n    return a + b")["input_ids"]
    got = ModelRunner(model).forward(ids, n_logits=len(ids))
    want = ModelRunner(dequantized_copy(original, dtype)).forward(ids, n_logits=len(ids))
    float_model = ModelRunner(target).forward(ids, n_logits=len(ids))
    to_dequantized = float((got - want).norm() / want.norm())
    to_float = float((got - float_model).norm() / float_model.norm())
    print(f"\n{dtype}: relative logit error {to_dequantized:.2e} to the dequantized fp32 model, {to_float:.3f} to the float one")
    assert to_dequantized < bound
    assert to_float > 0.3  # the 4-bit rounding, not the kernel: measured 0.6


@pytest.mark.parametrize("drafter_kind", ["float", "4-bit"])
def test_greedy_speculation_on_the_4bit_target_equals_its_plain_decoding(converted, tiny_pair, drafter_kind):
    """Lossless with respect to the 4-bit model: torch's CPU int4 / int8 kernels compute each
    row alone (tests/kernels/test_int4pack.py), so verifying k+1 rows equals k+1 steps. On a GPU
    this is not guaranteed (the kernels' tiles may change with the row count): gpu_check.sh
    measures it there."""
    tokenizer, model, _, _ = converted
    drafter = tiny_pair[2]
    if drafter_kind == "4-bit":
        drafter = copy.deepcopy(drafter).to(DTYPE)
        report = to_4bit_device_weights(drafter, "cpu", tables="keep")
        assert isinstance(drafter.lm_head, torch.nn.Linear) and report.int8_layers == 0  # a drafter's head stays
    accepted = assert_speculation_matches_plain(model, drafter, tokenizer, PROMPTS)
    assert accepted > 0


def _q4_1(n: int, k: int, seed: int) -> AffineInt4:
    """A GGUF Q4_1 tensor as the affine form (value = d * code + m per 32), via gguf-py."""
    import numpy as np
    from gguf import GGMLQuantizationType, quants

    w = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32) * 0.3
    raw = np.asarray(quants.quantize(w, GGMLQuantizationType.Q4_1)).reshape(n, k // 32, 20)
    d = raw[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    m = raw[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    codes = np.concatenate([raw[..., 4:] & 0x0F, raw[..., 4:] >> 4], axis=-1).reshape(n, k)
    return AffineInt4(torch.from_numpy(codes.astype(np.uint8)), torch.from_numpy(d), torch.from_numpy(m))


def test_given_codes_and_8bit_layers_are_used_as_told(tiny_pair):
    _, target, _ = tiny_pair
    model = copy.deepcopy(target).to(DTYPE)
    up = "model.layers.1.mlp.up_proj"
    given = _q4_1(*model.get_submodule(up).weight.shape, seed=1)
    kept = "model.layers.0.mlp.down_proj"  # as a Q6_K tensor would be
    report = to_4bit_device_weights(model, "cpu", given={up: given}, keep_8bit={kept})
    assert isinstance(model.get_submodule(kept), Int8PackLinear) and report.int8_layers == 2  # and the head
    layer = model.get_submodule(up)
    assert isinstance(layer, Int4PackLinear)
    x = torch.randn(5, layer.in_features, generator=torch.Generator().manual_seed(2)).to(DTYPE)
    want = reference.linear(x, given.codes, reference.scales_and_zeros(given.scale, given.offset, DTYPE))
    torch.testing.assert_close(layer(x), want, rtol=2 ** -7, atol=1e-3)
    with pytest.raises(ValueError, match="layers the model does not have"):
        to_4bit_device_weights(copy.deepcopy(target), "cpu", given={"model.no_such": given})
    with pytest.raises(ValueError, match="do not match the layer"):
        to_4bit_device_weights(copy.deepcopy(target), "cpu", given={"model.layers.0.self_attn.q_proj": given})


def _qwen2(vocab: int, hidden: int, intermediate: int, tied: bool):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied, max_position_embeddings=256)
    return Qwen2ForCausalLM(config).eval().to(DTYPE)


def test_shapes_the_kernels_do_not_take_stay_as_loaded():
    model = _qwen2(vocab=320, hidden=64, intermediate=100, tied=False)  # 100: gate/up N and down K don't fit
    report = to_4bit_device_weights(model, "cpu")
    assert set(report.kept_layers) == {f"model.layers.{i}.mlp.{p}_proj" for i in range(2) for p in ("gate", "up", "down")}
    assert isinstance(model.model.layers[0].mlp.up_proj, torch.nn.Linear)
    assert isinstance(model.model.layers[0].self_attn.q_proj, Int4PackLinear)
    assert ModelRunner(model).forward([1, 2, 3]).isfinite().all()


def test_a_tied_embedding_shares_the_heads_int8_table():
    model = _qwen2(vocab=320, hidden=64, intermediate=128, tied=True)
    ids = torch.tensor([[5, 17, 300]])
    table = model.get_input_embeddings().weight.detach().float().clone()
    report = to_4bit_device_weights(model, "cpu")
    embed = model.get_input_embeddings()
    assert isinstance(embed, Int8Embedding) and embed.q is model.lm_head.q and embed.scale is model.lm_head.scale
    assert report.int8_bytes == model.lm_head.q.nbytes + model.lm_head.scale.nbytes  # counted once
    rows = embed(ids)[0].float()
    assert rows.dtype is torch.float32 and float((rows - table[ids[0]]).abs().max()) <= float(table.abs().max()) / 127


@pytest.mark.parametrize("tied", [False, True])
def test_the_memory_fit_budgets_what_the_converted_model_holds(tied):
    """int4_device_bytes from the parameter count and shapes against the bytes of every tensor
    the converted model holds (norms and biases, budgeted as decoder weights, are the gap)."""
    model = _qwen2(vocab=512, hidden=128, intermediate=256, tied=tied)
    params = sum(p.numel() for p in model.parameters())
    arch = architecture_from_config(model.config.to_dict())
    to_4bit_device_weights(model, "cpu")
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in [*model.parameters(), *model.buffers()] if t.is_floating_point() or t.dtype in (torch.int8, torch.uint8, torch.int32)}
    held = sum(storages.values()) - sum(b.nbytes for n, b in model.named_buffers() if n.endswith("inv_freq"))
    budget = int4_device_bytes(params, arch)
    print(f"\ntied={tied}: budget {budget:,} B, held {held:,} B")
    assert abs(budget - held) / held < 0.02


def test_devices_without_the_kernel_are_refused(tiny_pair):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError, match="cannot run here: no CUDA device"):
        to_4bit_device_weights(copy.deepcopy(tiny_pair[1]), "cuda")


def test_the_loaders_device_path_converts_a_saved_model(tmp_path, tiny_pair):
    """The loader's 4-bit device branch (engine.models.loading.loader._load_device_int4) on the CPU,
    the one device here: a folder in, Int4PackLinear layers on the device out. On a machine
    without CUDA asking for int4 there says why."""
    from engine.models.loading import loader as loading

    tokenizer, target, _ = tiny_pair
    target.save_pretrained(tmp_path / "t")
    tokenizer.save_pretrained(tmp_path / "t")
    loaded = loading._load_device_int4(tmp_path / "t", torch.device("cpu"), DTYPE, "target", True)
    assert loaded.weights == "int4" and loaded.dtype is DTYPE and loaded.tokenizer is not None
    assert isinstance(loaded.model.model.layers[0].mlp.up_proj, Int4PackLinear)
    assert isinstance(loaded.model.lm_head, Int8PackLinear)
    drafter = loading._load_device_int4(tmp_path / "t", torch.device("cpu"), DTYPE, "drafter", False)
    assert isinstance(drafter.model.lm_head, torch.nn.Linear)  # a drafter's head stays for its reduced head
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="int4 cannot run on cuda: no CUDA device"):
            loading.load_model(tmp_path / "t", "int4", "cuda", check_memory=False)
