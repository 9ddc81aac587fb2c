"""Device placement: dtype per device, the memory check before loading, the CPU path as before."""
import json

import pytest
import torch

from engine.core.sampler import Sampler, generator_device
from engine.core.settings import DecodeSettings
from engine.models.loading.placement import (
    DoesNotFit,
    check_fits,
    dtype_for,
    free_memory,
    model_entry,
    pick_device,
    precision_name,
)
from engine.models.planning.hardware import Hardware

# Qwen2.5-Coder-1.5B and -0.5B shapes (the default pair), without weights: parameter counts are
# then estimated from the shapes.
TARGET = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 1536, "num_hidden_layers": 28,
          "num_attention_heads": 12, "num_key_value_heads": 2, "intermediate_size": 8960, "vocab_size": 151936,
          "max_position_embeddings": 32768, "tie_word_embeddings": True, "torch_dtype": "bfloat16"}
DRAFTER = {**TARGET, "hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "intermediate_size": 4864}


@pytest.fixture
def folders(tmp_path):
    paths = []
    for name, config in (("Qwen2.5-Coder-1.5B-Instruct", TARGET), ("Qwen2.5-Coder-0.5B-Instruct", DRAFTER)):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config))
        paths.append(folder)
    return paths


@pytest.mark.parametrize(
    "device, bf16, precision, expected",
    [
        ("cpu", None, "bf16", torch.bfloat16),
        ("cpu", None, "fp32", torch.float32),
        ("cuda", True, "bf16", torch.bfloat16),   # Ampere and later (H100/H200, RTX 30xx+)
        ("cuda", False, "bf16", torch.float16),   # Turing and older have no bf16
        ("cuda", True, "fp32", torch.float32),
        ("mps", None, "bf16", torch.float16),     # native on every Apple GPU
        ("mps", None, "fp32", torch.float32),
    ],
)
def test_dtype_per_device(device, bf16, precision, expected):
    assert dtype_for(precision, torch.device(device), bf16=bf16) is expected


def test_unknown_precision_is_refused():
    with pytest.raises(ValueError, match="'file', 'bf16', 'fp32', 'int8' or 'int4'"):
        dtype_for("turbo", torch.device("cpu"))


def test_auto_device_on_this_machine():
    expected = "cuda" if torch.cuda.is_available() else ("mps" if torch.backends.mps.is_available() else "cpu")
    assert pick_device("auto").type == expected
    assert pick_device("cpu").type == "cpu"


def test_precision_names():
    assert [precision_name(d) for d in (torch.float32, torch.bfloat16, torch.float16)] == ["fp32", "bf16", "fp16"]


def test_small_gpu_gives_a_readable_error(folders):
    laptop = Hardware.from_profile({"ram_gb": 16, "gpus": [{"name": "RTX 4060 Laptop", "vram_gb": 8, "vram_free_gb": 7.5}]})
    with pytest.raises(DoesNotFit) as err:
        check_fits(folders[0], folders[1], torch.float32, torch.device("cuda"), hardware=laptop)
    message = str(err.value)
    assert "Qwen2.5-Coder-1.5B-Instruct with its drafter Qwen2.5-Coder-0.5B-Instruct does not fit" in message
    assert "RTX 4060 Laptop has 7.5 GB free" in message
    assert "at fp32" in message and "weights" in message and "drafter" in message
    assert "'bf16' precision" in message and "the CPU" in message
    # In bf16 the same pair fits that GPU.
    estimate = check_fits(folders[0], folders[1], torch.bfloat16, torch.device("cuda"), hardware=laptop)
    assert estimate.total < 7.5e9


def test_big_gpu_fits_and_estimate_counts_both_models(folders):
    h200 = Hardware.from_profile({"ram_gb": 128, "gpus": [{"name": "NVIDIA H200", "vram_gb": 141}]})
    both = check_fits(folders[0], folders[1], torch.bfloat16, torch.device("cuda"), hardware=h200)
    alone = check_fits(folders[0], None, torch.bfloat16, torch.device("cuda"), hardware=h200)
    assert both.drafter > 0 and alone.drafter == 0
    assert 3.0e9 < alone.weights < 3.4e9  # ~1.54B parameters x 2 bytes


def test_apple_unified_memory_budget(folders):
    mac = Hardware.from_profile({"unified_memory_gb": 8})  # working set ~5.3 GB
    check_fits(folders[0], folders[1], torch.float16, torch.device("mps"), hardware=mac)
    small = Hardware.from_profile({"unified_memory_gb": 8, "gpu_working_set_gb": 2})
    with pytest.raises(DoesNotFit, match="unified memory has 2.0 GB free"):
        check_fits(folders[0], folders[1], torch.float16, torch.device("mps"), hardware=small)


def test_no_gpu_in_profile_is_said(folders):
    desktop = Hardware.from_profile({"ram_gb": 32})
    with pytest.raises(DoesNotFit, match="no CUDA device"):
        check_fits(folders[0], None, torch.bfloat16, torch.device("cuda"), hardware=desktop)


def test_cpu_budget_is_available_ram(folders):
    budget, label = free_memory(torch.device("cpu"))
    assert budget > 0 and label == "RAM"
    assert model_entry(folders[0], folders[1]).drafter_kind == "draft_model"


def test_cpu_load_is_not_checked(tmp_path, tiny_pair, monkeypatch):
    """The CPU path loads as before: no memory check, bf16 in fast mode, a CPU generator."""
    import engine.models.loading.loader as loading

    tokenizer, target, _ = tiny_pair
    target.save_pretrained(tmp_path / "t")
    tokenizer.save_pretrained(tmp_path / "t")

    def refuse(*args, **kwargs):
        raise AssertionError("the CPU path must not run the memory check")

    monkeypatch.setattr(loading, "check_fits", refuse)
    loaded = loading.load_model(tmp_path / "t", "bf16", device="cpu", fast_kernels=False)
    assert loaded.device.type == "cpu" and loaded.dtype is torch.bfloat16
    assert generator_device(loaded.device).type == "cpu"


def test_generator_lives_on_cuda_only():
    assert generator_device("cpu").type == "cpu"
    assert generator_device("mps").type == "cpu"  # MPS: no float64 for the race weights
    assert generator_device(None).type == "cpu"
    assert Sampler(DecodeSettings(mode="sample"), "cpu").generator.device.type == "cpu"
    if torch.cuda.is_available():
        assert Sampler(DecodeSettings(mode="sample"), "cuda").generator.device.type == "cuda"


def test_sampler_on_device_token_matches_host_token():
    settings = DecodeSettings(mode="sample", seed=3)
    logits = torch.randn(50, generator=torch.Generator().manual_seed(0))
    a, b = Sampler(settings), Sampler(settings)
    token, p = a.choose_on_device(logits)
    assert token.dim() == 0 and int(token) == b.choose(logits)[0]
    assert torch.equal(p, b.probs(logits))
