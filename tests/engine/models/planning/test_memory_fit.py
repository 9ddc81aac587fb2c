"""Memory estimates: the K/V cache against real caches, the parts of an estimate, GGUF variants."""
from dataclasses import replace

import pytest
import torch

from engine.models.planning.architecture import architecture_from_config
from engine.models.planning.fit import assess
from engine.models.planning.hardware import Hardware
from engine.models.planning.memory_fit import activation_bytes, estimate_memory, quantized_drafter_bytes
from engine.models.runners.runner import ModelRunner
from tests.engine.models.planning.conftest import entry
from tests.engine.models.planning.test_hardware import MACHINES

# -- the K/V estimate is the bytes of a real transformers cache --------------------------------


def cache_bytes(cache) -> int:
    """Bytes of every distinct storage the cache's K/V tensors live in (a sliced view keeps its
    whole storage alive, and that is what memory pays for)."""
    storages = {}
    for layer in cache.layers:
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(t, torch.Tensor) and t.numel():
                storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(storages.values())


def run_tokens(model, prompt_len: int, steps: int, vocab: int):
    """Prefill ``prompt_len`` tokens in one pass, then decode ``steps`` tokens one at a time, as
    the engine does. Returns (runner, bytes right after the prefill)."""
    runner = ModelRunner(model)
    gen = torch.Generator().manual_seed(0)
    runner.forward(torch.randint(0, vocab, (prompt_len,), generator=gen).tolist())
    after_prefill = cache_bytes(runner.cache)
    for _ in range(steps):
        runner.forward([int(torch.randint(0, vocab, (1,), generator=gen))])
    return runner, after_prefill


def tiny_qwen2(sliding: bool):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=256, use_sliding_window=sliding,
                         sliding_window=8 if sliding else None, max_window_layers=1)
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).eval()


def tiny_gemma4():
    """Gemma 4's whole attention layout in miniature: sliding and full layers with different K/V
    shapes (global_head_dim, attention_k_eq_v with its own K/V head count) and trailing layers
    that reuse earlier layers' K/V."""
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    config = Gemma4TextConfig(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=7, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, global_head_dim=32, num_global_key_value_heads=1, attention_k_eq_v=True,
        sliding_window=8, layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2 + ["full_attention"],
        num_kv_shared_layers=2, hidden_size_per_layer_input=8, vocab_size_per_layer_input=96, max_position_embeddings=256,
    )
    torch.manual_seed(0)
    return Gemma4ForCausalLM(config).eval()


@pytest.mark.parametrize("prompt_len, steps", [(5, 2), (20, 3), (64, 1)])
@pytest.mark.parametrize("build", ["qwen2", "qwen2-sliding", "gemma4"])
def test_kv_estimate_equals_a_real_cache(build, prompt_len, steps):
    model = {"qwen2": lambda: tiny_qwen2(False), "qwen2-sliding": lambda: tiny_qwen2(True), "gemma4": tiny_gemma4}[build]()
    arch = architecture_from_config(model.config.to_dict())
    if build != "qwen2":
        assert arch.sliding is not None and arch.sliding.window == 8  # the case under test
    runner, after_prefill = run_tokens(model, prompt_len, steps, model.config.vocab_size)
    dtype_bytes = 4  # float32
    assert cache_bytes(runner.cache) == arch.kv_bytes(prompt_len + steps, dtype_bytes)
    assert after_prefill == arch.prefill_kv_bytes(prompt_len, dtype_bytes)


def test_published_style_gemma4_config_gives_the_same_kv():
    # Hub configs give global_head_dim / num_global_key_value_heads instead of per_layer_config.
    model = tiny_gemma4()
    config = model.config.to_dict()
    config.pop("per_layer_config")
    config.update(global_head_dim=32, num_global_key_value_heads=1, attention_k_eq_v=True)
    runner, _ = run_tokens(model, 30, 2, 96)
    assert cache_bytes(runner.cache) == architecture_from_config(config).kv_bytes(32, 4)


# -- estimates -------------------------------------------------------------------------------


def test_kv_per_token_of_the_default_target(entries):
    e = entry(entries, "qwen2.5-coder-1.5b")
    per_token = 2 * 28 * 2 * 128 * 2  # K and V x layers x kv heads x head dim x bf16
    assert estimate_memory(e, "bf16", 1000).kv_cache == 1000 * per_token
    assert estimate_memory(e, "fp32", 1000).kv_cache == 2000 * per_token


def test_sliding_layers_stop_growing_at_their_window(entries):
    e = entry(entries, "gemma-4-31b")
    kv = lambda n: estimate_memory(e, "bf16", n).kv_cache  # noqa: E731
    full_per_token = 2 * 10 * 4 * 512 * 2
    assert kv(8192) - kv(4096) == 4096 * full_per_token  # past the 1024 window only full layers grow
    assert kv(1024) - kv(512) == 512 * (full_per_token + 2 * 50 * 16 * 256 * 2)


def test_drafter_memory_by_kind(entries):
    # A draft model held at 16 bits (the CPU's "auto" quantizes it: tests/engine/models/planning/test_drafter_fit.py).
    draft_model = estimate_memory(entry(entries, "qwen3-8b"), "bf16", 4096, drafter_weights="bf16")
    drafter_kv = 4096 * 2 * 28 * 8 * 128 * 2
    assert draft_model.drafter == entry(entries, "qwen3-8b").drafter_params * 2 + drafter_kv
    assistant = entry(entries, "gemma-4-e4b")
    assert estimate_memory(assistant, "bf16", 4096).drafter == assistant.drafter_params * 2  # no K/V of its own
    assert estimate_memory(entry(entries, "glm-4.5-air"), "bf16", 4096).drafter == 0  # MTP: inside the target
    lookup = replace(entry(entries, "qwen3-8b"), drafter_kind="lookup", drafter_repo=None, drafter_arch=None)
    assert estimate_memory(lookup, "bf16", 4096).drafter == 0


def test_drafters_made_for_the_target_as_the_engine_holds_them(entries):
    """Their linears int8 where the CPU kernels run (fp32 elsewhere), a shipped embedding at its
    stored bf16, fp32 K/V of their own (EAGLE-3's one layer, DFlash's five). Both keep the
    target's states of the prompt's rows (three layers', one per draft layer)."""
    eagle, dflash = entry(entries, "qwen3-8b-eagle3"), entry(entries, "qwen3-8b-dflash")
    variant = eagle.variants[0]
    kv_row = lambda layers: 2 * layers * 8 * 128 * 4  # noqa: E731  fp32 K and V, 8 heads of 128
    est = lambda e, weights: estimate_memory(e, "file", 4096, "cpu", variant=variant, drafter_weights=weights,  # noqa: E731
                                             cpu_kernels=True)
    embedding = eagle.drafter_embedding_params
    assert embedding == 151936 * 4096
    assert est(eagle, "int8").drafter == (eagle.drafter_params - embedding) + 2 * embedding + 4096 * kv_row(1)
    assert est(eagle, "bf16").drafter == 4 * (eagle.drafter_params - embedding) + 2 * embedding + 4096 * kv_row(1)
    assert est(dflash, "int8").drafter == dflash.drafter_params + 4096 * kv_row(5)
    assert est(dflash, "bf16").drafter == 4 * dflash.drafter_params + 4096 * kv_row(5)
    # Their cache doubles from 64 positions: 5,000 tokens hold 8,192.
    assert estimate_memory(eagle, "file", 5000, "cpu", variant=variant, drafter_weights="int8", cpu_kernels=True).drafter \
        == est(eagle, "int8").drafter + 4096 * kv_row(1)
    plain = replace(eagle, drafter_kind="lookup", drafter_repo=None, drafter_arch=None, drafter_params=0)
    base = estimate_memory(plain, "file", 4096, "cpu", variant=variant, cpu_kernels=True).overhead
    assert est(eagle, "int8").overhead - base == 4096 * 3 * 4096 * 4
    assert est(dflash, "int8").overhead - base == 4096 * 5 * 4096 * 4
    # The target keeps its own GGUF runner beside them: its K/V at 16 bits.
    assert est(eagle, "int8").kv_cache == estimate_memory(plain, "file", 4096, "cpu", variant=variant, cpu_kernels=True).kv_cache


def test_estimate_parts_scale_sensibly(entries):
    e = entry(entries, "qwen2.5-coder-7b")
    bf16, fp32, int4 = (estimate_memory(e, p, 4096, "gpu") for p in ("bf16", "fp32", "int4"))
    assert fp32.weights == 2 * bf16.weights == e.weight_bytes("fp32")
    # 4-bit on a GPU: 5 bits a decoder weight, the LM head and the input embedding at int8.
    assert bf16.weights * 0.3 < int4.weights < bf16.weights * 0.35
    assert fp32.overhead > bf16.overhead  # fp32 activations
    short, long = estimate_memory(e, "bf16", 2048), estimate_memory(e, "bf16", 32768)
    # The prompt is prefilled in chunks: one chunk's activations whatever the context.
    assert long.kv_cache == 16 * short.kv_cache and long.overhead == short.overhead
    # Where the drafter reads the target's states of every prompt row (MTP), they are kept
    # from the prefill's chunks until it drafts: a row's hidden state each.
    mtp = replace(e, drafter_kind="mtp")
    kept = estimate_memory(mtp, "bf16", 32768).overhead - estimate_memory(mtp, "bf16", 2048).overhead
    assert kept == (32768 - 2048) * e.hidden_size * 4
    cpu = estimate_memory(e, "bf16", 4096, "cpu")
    assert cpu.overhead != bf16.overhead  # the host runtime on the CPU, a CUDA context on the GPU
    with pytest.raises(ValueError):
        estimate_memory(e, "bf16", 0)


def test_a_gguf_target_budgets_one_prefill_chunk_and_its_attention_partials(entries):
    """Precision "file": the MLP's peak of one 256-row chunk, or the attention kernel's partial
    softmaxes over a long cache, whichever is larger (kernels/attention/attention_avx2.cpp)."""
    from engine.core.settings import PREFILL_CHUNK

    arch = entry(entries, "default-offline").target_arch
    mlp_only = activation_bytes(arch, PREFILL_CHUNK, "file", "cpu")
    assert activation_bytes(arch, PREFILL_CHUNK, "file", "cpu", context=2048) == mlp_only
    deep = activation_bytes(arch, PREFILL_CHUNK, "file", "cpu", context=32768)
    partials = PREFILL_CHUNK * arch.attention_heads * ((32768 - PREFILL_CHUNK) // 256) * (arch.head_dim + 2) * 4
    assert deep > mlp_only and deep - partials == mlp_only - PREFILL_CHUNK * arch.intermediate_size * 17


def test_a_memory_mapped_untied_input_embedding_is_not_budgeted(entries):
    untied, tied = entry(entries, "qwen2.5-coder-7b"), entry(entries, "qwen2.5-coder-1.5b")
    embedding = 152064 * 3584 * 2
    assert estimate_memory(untied, "bf16", 4096, "cpu").weights == untied.weight_bytes("bf16") - embedding
    assert estimate_memory(untied, "bf16", 4096, "gpu").weights == untied.weight_bytes("bf16")  # copied to VRAM
    assert estimate_memory(untied, "fp32", 4096, "cpu").weights == untied.weight_bytes("fp32")  # converted: a copy
    assert estimate_memory(tied, "bf16", 4096, "cpu").weights == tied.weight_bytes("bf16")  # the LM head reads it all


def test_activation_model_matches_the_measured_prefill(entries):
    # Measured on this CPU: 93 MiB of activations prefilling 1,020 tokens into Qwen2.5-Coder-1.5B
    # (bf16, fast kernels); the model must be within 15% of that.
    measured = 93 * 2**20
    estimated = activation_bytes(entry(entries, "default-offline").target_arch, 1020, "bf16", "cpu")
    assert abs(estimated - measured) / measured < 0.15


# -- GGUF variants ------------------------------------------------------------------------------


def test_a_gguf_variant_is_budgeted_at_its_file_with_fp16_kv(entries):
    e = entry(entries, "qwen2.5-coder-7b")
    q4, _, q8 = e.variants
    est = estimate_memory(e, "file", 4096, "cpu", variant=q4, drafter_variant=e.drafter_variants[0], cpu_kernels=False)
    assert est.weights == q4.resident_bytes(e.target_arch)
    # Its tensors less what lookups leave unread of the untied Q4_K embedding (152,064 x 3,584).
    embedding = 152064 * 3584 // 256 * 144
    assert 0 < q4.file_bytes - est.weights - int(embedding * 0.97) < 10e6  # the header
    # engine.gguf computes in fp32; without the compiled CPU kernels its cache is transformers', fp32.
    assert est.kv_cache == e.target_arch.kv_bytes(4096, 4)
    # Without the quantized CPU kernels the GGUF drafter runs its file's blocks: budgeted as the file.
    assert est.drafter == e.drafter_variants[0].resident_bytes(e.drafter_arch) + e.drafter_arch.kv_bytes(4096, 4)
    # With them, the target runs on GgufRunner, which caches K/V in fp16 (its KV_DTYPE), and the
    # drafter's layers are re-quantized to int4 (engine.models.loading.gguf_drafter): as a folder's, its
    # cache fp16 too (FusedRunner's DRAFTER_KV_DTYPE).
    requantized = estimate_memory(e, "file", 4096, "cpu", variant=q4, drafter_variant=e.drafter_variants[0], cpu_kernels=True)
    assert requantized.kv_cache == e.target_arch.kv_bytes(4096, 2)
    assert requantized.drafter == (quantized_drafter_bytes(e.drafter_params, e.drafter_arch, "int4", "cpu")
                                   + e.drafter_arch.kv_bytes(4096, 2))
    # A drafter that reads transformers' cache of the target (MTP): fp32 there.
    mtp = estimate_memory(replace(e, drafter_kind="mtp"), "file", 4096, "cpu", variant=q4, cpu_kernels=True)
    assert mtp.kv_cache == e.target_arch.kv_bytes(4096, 4)
    q8_est = estimate_memory(e, "file", 4096, "cpu", variant=q8)
    assert est.weights < q8_est.weights < estimate_memory(e, "bf16", 4096, "cpu").weights
    with pytest.raises(ValueError, match="needs the GGUF variant"):
        estimate_memory(e, "file", 4096, "cpu")
    with pytest.raises(ValueError, match="needs the GGUF variant"):
        estimate_memory(e, "bf16", 4096, "cpu", variant=q4)


def test_fit_results_say_which_variant_runs_and_where_it_comes_from(entries):
    hw = Hardware.from_profile({"ram_gb": 16, "cpu_cores": 8})
    e = entry(entries, "qwen3-8b")
    r = assess(e, hw, context=4096, variant=e.variants[0])
    assert (r.variant, r.precision, r.device, r.source) == ("Q4_K_M", "file", "cpu", "hub")
    assert r.file_bytes == e.variants[0].file_bytes and r.gguf == e.variants[0]
    assert r.drafter_gguf == e.drafter_variants[0]
    row = r.to_dict()
    assert row["variant"] == "Q4_K_M" and row["file_bytes"] == e.variants[0].file_bytes and row["source"] == "hub"
    assert row["gguf"]["files"] == ["Qwen3-8B-Q4_K_M.gguf"]
    st = assess(e, hw, "bf16", 4096)
    assert st.variant == "safetensors" and st.file_bytes == e.weight_bytes("bf16") and st.gguf is None
    assert assess(entry(entries, "default-offline"), hw, "bf16", 4096).source == "pypi"
    assert assess(e, hw, "file", 4096).gguf == e.variants[0]  # "file" alone: the smallest quant
    with pytest.raises(ValueError, match="it has none"):
        assess(entry(entries, "gemma-4-e4b"), hw, "file", 4096)
    # A GGUF target runs on the CPU only (engine.gguf): not offered on a GPU.
    on_gpu = assess(e, Hardware.from_profile(MACHINES["desktop-gpu-24"]), context=4096, variant=e.variants[0])
    assert on_gpu.device == "cpu"


# The three machines the picker is shown on (figures in docs/benchmarks/log.md).
