"""Fits and recommendations on described machines, and the picker's table on three of them."""
import json
import subprocess
import sys

from engine.models.planning.catalog import entry_from_config
from engine.models.planning.fit import assess, headroom, recommend, recommended_context
from engine.models.planning.hardware import GB, Hardware
from engine.models.planning.memory_fit import FIT_ORDER, estimate_memory
from tests.engine.helpers import recommended
from tests.engine.models.planning.conftest import entry
from tests.engine.models.planning.test_hardware import MACHINES
from tests.paths import REPO_ROOT as ROOT

# -- fits and recommendations on described machines -------------------------------------------


def machine(name):
    return Hardware.from_profile(MACHINES[name])


def results_for(entries, name, **kwargs):
    """16-bit fits unless ``precisions`` says otherwise (4-bit on GPUs and Macs:
    tests/engine/models/planning/test_int4_device_fit.py)."""
    results = recommend(entries, machine(name), **{"precisions": ("bf16",), **kwargs})
    by_id = {r.entry.id: r for r in results}
    best = [r for r in results if r.recommended]
    assert len(best) == 1, f"{name}: {len(best)} recommended"
    ranks = [FIT_ORDER[r.fit] for r in results]
    assert ranks == sorted(ranks), "GPU before unified before CPU before tight before none"
    return results, by_id, best[0]


def test_8gb_apple_laptop(entries):
    results, by_id, best = results_for(entries, "apple-8")
    assert best.fit in ("unified", "cpu") and best.entry.target_params < 2.5e9
    assert all(r.fit == "none" for r in results if r.entry.target_params > 3e9)
    assert by_id["smollm2-1.7b"].fit == "unified"


def test_16gb_laptop_with_an_8gb_gpu(entries):
    _, by_id, best = results_for(entries, "laptop-16-gpu-8")
    assert best.fit == "gpu" and best.entry.target_params < 2.5e9
    assert by_id["qwen2.5-coder-1.5b"].fit == "gpu"
    assert by_id["qwen2.5-coder-3b"].fit in ("cpu", "tight")  # 6.2 GB weights + drafter: not on 8 GB with headroom
    assert by_id["qwen2.5-coder-7b"].fit == "none"
    assert by_id["gemma-4-31b"].fit == "none"


def test_24gb_gpu_desktop(entries):
    _, by_id, best = results_for(entries, "desktop-gpu-24")
    assert best.fit == "gpu" and 7e9 < best.entry.target_params < 9e9
    assert best.context >= 4096
    assert by_id["qwen2.5-coder-7b"].fit == "gpu"
    assert by_id["qwen2.5-coder-14b"].fit == "none"  # 29.5 GB of bf16 weights
    assert by_id["default-offline"].fit == "gpu" and by_id["default-offline"].context == 32768


def test_64gb_apple_unified_memory(entries):
    _, by_id, best = results_for(entries, "apple-64")
    assert best.fit == "unified" and best.entry.target_params > 14e9
    assert by_id["qwen3-32b"].fit == "none" and by_id["glm-4.5-air"].fit == "none"
    assert "unified memory" in best.reason


def test_cpu_only_32gb(entries):
    results, by_id, best = results_for(entries, "cpu-32")
    assert best.fit == "cpu" and 7e9 < best.entry.target_params < 9e9
    assert {r.fit for r in results} <= {"cpu", "tight", "none"}
    assert by_id["qwen2.5-coder-14b"].fit == "none"


def test_reasons_state_need_and_free_memory(entries):
    hw = machine("desktop-gpu-24")
    r = assess(entry(entries, "qwen2.5-coder-7b"), hw, "bf16", 4096)
    assert r.fit == "gpu" and r.device == "gpu" and r.context == 4096
    assert r.reason == f"needs {r.estimate.total / GB:.1f} GB, 24.0 GB free (RTX 4090)"
    none = assess(entry(entries, "glm-4.5-air"), hw, "bf16", 4096)
    assert none.fit == "none" and none.reason.endswith("does not fit")


def test_tight_is_between_fitting_and_not(entries):
    e = entry(entries, "qwen3-4b")
    need = estimate_memory(e, "bf16", 4096, "cpu").total
    comfortable = Hardware.from_profile({"ram_gb": 64, "ram_available_gb": (need + headroom(need) * 2) / GB})
    tight = Hardware.from_profile({"ram_gb": 64, "ram_available_gb": (need + GB // 10) / GB})
    short = Hardware.from_profile({"ram_gb": 64, "ram_available_gb": (need - GB // 10) / GB})
    assert assess(e, comfortable, "bf16", 4096).fit == "cpu"
    r = assess(e, tight, "bf16", 4096)
    assert r.fit == "tight" and r.device == "cpu" and "to spare" in r.reason
    assert assess(e, short, "bf16", 4096).fit == "none"


def test_a_model_too_big_for_the_gpu_falls_back_to_the_cpu(entries):
    hw = Hardware.from_profile({"ram_gb": 64, "gpus": [{"name": "small", "vram_gb": 4}]})
    r = assess(entry(entries, "qwen3-8b"), hw, "bf16", 4096)
    assert r.fit == "cpu" and r.device == "cpu"


def test_nothing_fits_means_nothingrecommended(entries):
    results = recommend(entries, Hardware.from_profile({"ram_gb": 2, "ram_available_gb": 1}))
    assert not any(r.recommended for r in results)
    assert all(r.fit == "none" for r in results)


def test_recommended_context_prefers_the_best_device(entries):
    hw = machine("laptop-16-gpu-8")
    e = entry(entries, "qwen2.5-coder-1.5b")
    context = recommended_context(e, hw)
    r = assess(e, hw, "bf16", context)
    assert r.fit == "gpu"  # not a longer context that only the CPU could hold
    assert 2048 <= context <= e.max_context
    longer = assess(e, hw, "bf16", context * 2)
    assert longer.fit != "gpu" or context * 2 > e.max_context


def test_explicit_context_is_used_everywhere(entries):
    results = recommend(entries, machine("cpu-32"), context=8192)
    assert {r.context for r in results} == {8192}


def test_precision_preference(entries):
    hw = machine("desktop-gpu-24")
    e = entry(entries, "qwen2.5-coder-32b")
    [bf16] = recommend([e], hw, precisions=("bf16",))
    assert bf16.fit == "none"
    [int4] = recommend([e], hw, precisions=("bf16", "int4"))
    assert int4.precision == "int4" and int4.fit == "cpu"  # the engine's int4 in 32 GB of RAM
    # On the 24 GB GPU a 4-bit 32B (21 GB of weights) and its drafter fit without headroom.
    assert assess(e, hw, "int4", devices=("gpu",)).fit == "tight"


def test_unknown_architecture_fit_is_flagged(entries):
    config = {"model_type": "novelformer", "num_hidden_layers": 24, "hidden_size": 2048, "vocab_size": 32000,
              "num_attention_heads": 16}
    r = assess(entry_from_config("someone/novelformer", config), machine("cpu-32"), "bf16", 4096)
    assert r.estimate.conservative and "conservative estimate" in r.reason
    assert r.predicted_speedup == (1.0, 1.6)  # prompt lookup
    assert any("unknown architecture 'novelformer'" in n for n in r.to_dict()["notes"])


def test_result_json_has_the_documented_fields(entries):
    row = recommend(entries, machine("desktop-gpu-24"))[0].to_dict()
    assert {"id", "target_repo", "drafter_repo", "drafter_kind", "precision", "context", "estimate_bytes", "fit",
            "reason", "recommended", "predicted_speedup"} <= set(row)
    parts = row["estimate_bytes"]
    assert parts["total"] == parts["weights"] + parts["kv_cache"] + parts["drafter"] + parts["overhead"]
    json.dumps(row)


def test_importing_catalog_and_fit_does_not_import_torch():
    # The Qt app reads the catalog and fits on its GUI thread, where torch must not load.
    code = ("import sys; import engine.models.planning.catalog, engine.models.planning.fit, engine.models.planning.hardware as h; "
            "from engine.models.planning.catalog import load_catalog; from engine.models.planning.fit import recommend; "
            "recommend(load_catalog(), h.Hardware.from_profile({'ram_gb': 16})); "
            "h.detect_hardware(); "
            "print(sorted(m for m in ('torch', 'transformers', 'PySide6') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


PICKER_MACHINES = {
    "8 GB Mac (MPS, unified memory)": {"unified_memory_gb": 8},
    "16 GB laptop (CPU only, 8 cores)": {"ram_gb": 16, "cpu_cores": 8},
    "24 GB GPU (CUDA)": {"ram_gb": 32, "cpu_cores": 8, "gpus": [{"name": "RTX 4090", "vram_gb": 24}]},
}
SEVEN_EIGHT_B = ("qwen2.5-coder-7b", "qwen3-8b", "llama-3.1-8b")


def picker_table(entries) -> dict[str, dict[str, object]]:
    table = {}
    for name, profile in PICKER_MACHINES.items():
        results = recommend(entries, Hardware.from_profile(profile))
        by_id = {r.entry.id: r for r in results}
        best = recommended(results)
        print(f"\n{name}: recommended {best.entry.id} {best.variant} ({best.precision}) on {best.device}, "
              f"needs {best.estimate.total / GB:.2f} GB")
        for entry_id in SEVEN_EIGHT_B:
            r = by_id[entry_id]
            q4 = r.entry.variants[0]
            q4_fit = assess(r.entry, Hardware.from_profile(profile), context=r.context, variant=q4)
            print(f"  {entry_id:18} {r.variant:11} {r.precision:5} {r.device:8} {r.fit:8} ctx {r.context:>6} "
                  f"needs {r.estimate.total / GB:5.2f} GB; Q4_K_M file {q4.file_bytes / GB:.2f} GB "
                  f"({q4.size_source}), needs {q4_fit.estimate.total / GB:.2f} GB there ({q4_fit.fit})")
        table[name] = {"best": best, **by_id}
    return table


def test_the_picker_on_three_machines(entries):
    table = picker_table(entries)
    mac, laptop, gpu = (table[name] for name in PICKER_MACHINES)
    # 8 GB Mac: 6 GB for the CPU (where GGUF runs), 5.3 GB of Metal working set: no 7-8B model
    # fits with room to spare; a 4.7 GB Q4_K_M file with its drafter, runtime and fp16 K/V at
    # 2k is tight at best.
    assert all(mac[e].fit in ("tight", "none") for e in SEVEN_EIGHT_B)
    assert mac["best"].fit == "unified" and mac["best"].entry.target_params < 5e9
    # 16 GB CPU laptop: every 7-8B model runs as its Q4_K_M file (bf16 does not fit 12.8 GB; of
    # the files that fit, Q4_K_M reads the fewest bytes a token).
    for e in SEVEN_EIGHT_B:
        r = laptop[e]
        assert (r.variant, r.fit, r.device) == ("Q4_K_M", "cpu", "cpu") and r.cpu_tok_s > 5
        assert r.file_bytes == r.entry.variants[0].file_bytes
    assert laptop["best"].precision == "file"
    # 24 GB GPU: the safetensors model in bf16 on the GPU beats any file on the CPU.
    for e in SEVEN_EIGHT_B:
        assert (gpu[e].variant, gpu[e].precision, gpu[e].fit) == ("safetensors", "bf16", "gpu")
