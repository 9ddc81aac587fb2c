"""The memory fit budgets the draft model the loader really builds: the weights "auto" picks
(engine.models.planning.drafter_choice, one rule for both) and, next to a GGUF target, the drafter file
the app loads (or the converted folder the offline pair's drafter runs from)."""
from __future__ import annotations

import os
from dataclasses import replace

import pytest

from engine.bench.memory_probe import measure_steady
from engine.models.planning.catalog import find_entry, load_catalog
from engine.models.planning.drafter_choice import cpu_kernels_expected
from engine.models.planning.fit import assess, cpu_kernels_for
from engine.models.planning.hardware import Hardware
from engine.models.planning.memory_fit import auto_drafter_budget, estimate_memory, quantized_drafter_bytes
from engine.models.planning.variants import GgufVariant

LAPTOP = Hardware.from_profile({"ram_gb": 16, "cpu_cores": 8})


@pytest.fixture(scope="module")
def entries():
    return load_catalog()


def _entry(entries, entry_id):
    return find_entry(entry_id, entries)


def _drafter_kv(e, context, element_bytes=4):
    return e.drafter_arch.kv_bytes(context, element_bytes)


def test_the_fit_picks_the_drafter_weights_the_loader_picks_here():
    # This machine: the loader asks the kernels (torch); the fit guesses without torch.
    from engine.models.loading.loader import drafter_weights
    from engine.quant.quantize import int4_available, int8_available

    assert cpu_kernels_expected() == (int8_available() and int4_available())
    for engine_name, fit_name in (("bf16", "bf16"), ("fp32", "fp32"), ("int8", "int8"), ("int4", "int4"),
                                  ("file", "file")):
        assert auto_drafter_budget(fit_name, "cpu") == drafter_weights("auto", engine_name, "cpu"), engine_name


def test_a_gguf_target_budgets_the_int4_drafter_the_loader_builds(entries):
    # A GGUF target whose drafter has no GGUF file of its own (a local file matched with a model
    # folder, say): the loader quantizes the draft model, to int4 next to the file's cheap step.
    e = replace(_entry(entries, "qwen2.5-coder-7b"), drafter_variants=())
    variant = e.variants[0]
    est = estimate_memory(e, "file", 4096, "cpu", variant=variant, cpu_kernels=True)
    int4 = quantized_drafter_bytes(e.drafter_params, e.drafter_arch, "int4", "cpu")
    assert est.drafter == int4 + _drafter_kv(e, 4096, 2)  # its cache fp16 (FusedRunner's drafter cache)
    # The old budget, an int8 drafter, is ~100 MB more for the 0.5B drafter.
    int8 = estimate_memory(e, "file", 4096, "cpu", variant=variant, drafter_weights="int8").drafter
    assert int8 - est.drafter > 100e6
    # Without the quantized CPU kernels the loader keeps the drafter in the target's fp32.
    plain = estimate_memory(e, "file", 4096, "cpu", variant=variant, cpu_kernels=False)
    assert plain.drafter == 4 * e.drafter_params + _drafter_kv(e, 4096)
    assert assess(e, LAPTOP, "file", 4096, variant=variant).estimate.drafter == est.drafter


def test_quantized_and_16_bit_cpu_targets_budget_the_drafter_the_loader_quantizes(entries):
    e = _entry(entries, "qwen2.5-coder-7b")
    int4 = quantized_drafter_bytes(e.drafter_params, e.drafter_arch, "int4", "cpu")
    int8 = quantized_drafter_bytes(e.drafter_params, e.drafter_arch, "int8", "cpu")
    for precision in ("int8", "int4"):  # an int4 drafter, its tables at bf16 (not at the target's bits)
        assert estimate_memory(e, precision, 4096, "cpu", cpu_kernels=True).drafter == int4 + _drafter_kv(e, 4096, 2)
    for precision in ("bf16", "fp32"):  # int8 next to a 16-bit or an exact target, its cache fp16 either way
        assert estimate_memory(e, precision, 4096, "cpu", cpu_kernels=True).drafter == int8 + _drafter_kv(e, 4096, 2)
    # Off the CPU nothing changes: the target's dtype, 4-bit next to a 4-bit target.
    gpu = estimate_memory(e, "bf16", 4096, "gpu")
    assert gpu.drafter == e.drafter_params * 2 + _drafter_kv(e, 4096, 2)
    assert estimate_memory(e, "int4", 4096, "gpu").drafter == \
        quantized_drafter_bytes(e.drafter_params, e.drafter_arch, "int4", "gpu") + _drafter_kv(e, 4096, 2)


def test_which_machines_are_taken_to_run_the_cpu_kernels(tmp_path):
    assert cpu_kernels_for(Hardware.from_profile({"unified_memory_gb": 8})) is False  # Apple silicon
    assert cpu_kernels_for(LAPTOP) is True  # a described PC: an x86-64 CPU, as the speed figures assume
    no_avx2 = tmp_path / "cpuinfo"
    no_avx2.write_text("processor\t: 0\nflags\t\t: fpu sse sse2 ssse3 sse4_1 sse4_2\n")
    with_avx2 = tmp_path / "cpuinfo-avx2"
    with_avx2.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma f16c\n")
    import platform

    if platform.machine().lower() in ("x86_64", "amd64"):
        assert cpu_kernels_expected(no_avx2) is False and cpu_kernels_expected(with_avx2) is True
    else:
        assert cpu_kernels_expected(with_avx2) is False


def test_the_offline_pair_budgets_its_converted_drafter_not_its_gguf_file(entries):
    # The app runs the offline pair's drafter from its converted folder next to the GGUF target
    # (default_pair.prepare_pair), quantized by the loader: not the Q5_0 file the catalog lists.
    e = _entry(entries, "default-offline")
    fit = assess(e, LAPTOP, "file", 2048, variant=e.variants[0])
    assert fit.drafter_gguf is None
    int4 = estimate_memory(e, "file", 2048, "cpu", variant=e.variants[0], drafter_weights="int4")
    assert fit.estimate.drafter == int4.drafter
    # The Q5_0 file on its own blocks (no quantized kernels to re-quantize it for) is another budget.
    q5 = estimate_memory(e, "file", 2048, "cpu", variant=e.variants[0], drafter_variant=e.drafter_variants[0],
                         cpu_kernels=False)
    assert q5.drafter != fit.estimate.drafter


def test_a_gguf_row_budgets_the_drafter_file_its_download_fetches(entries):
    # Two drafter builds: next to the Q8_0 target the download pairs the Q8_0 drafter (the same
    # quantization), which the app then loads; the fit must budget that one, not the smallest.
    from engine.hub.gguf_plan import drafter_variant_for

    e = _entry(entries, "qwen2.5-coder-7b")
    q8_drafter = e.drafter_variants[0]
    assert q8_drafter.quant == "Q8_0"
    q4_drafter = GgufVariant("Q4_K_M", q8_drafter.repo, ("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",),
                             q8_drafter.file_bytes // 2, "computed")
    e = replace(e, drafter_variants=(q4_drafter, q8_drafter))
    q8 = next(v for v in e.variants if v.quant == "Q8_0")
    fit = assess(e, LAPTOP, "file", 4096, variant=q8)
    assert fit.drafter_gguf == drafter_variant_for(e, q8) == q8_drafter
    # Where the quantized CPU kernels run, the file's layers are re-quantized to int4 whichever
    # build it is (engine.models.loading.gguf_drafter); where they do not (Apple silicon), the file runs
    # on its own blocks and is budgeted as that file.
    assert fit.estimate.drafter == quantized_drafter_bytes(e.drafter_params, e.drafter_arch, "int4", "cpu") + _drafter_kv(e, 4096, 2)
    mac = assess(e, Hardware.from_profile({"unified_memory_gb": 16, "cpu_cores": 8}), "file", 4096, variant=q8)
    assert mac.drafter_gguf == q8_drafter
    assert mac.estimate.drafter == q8_drafter.resident_bytes(e.drafter_arch) + _drafter_kv(e, 4096)
    q4 = e.variants[0]
    assert assess(e, LAPTOP, "file", 4096, variant=q4).drafter_gguf == drafter_variant_for(e, q4) == q4_drafter


@pytest.mark.slow
def test_the_offline_pairs_gguf_target_with_its_quantized_drafter_is_estimated_within_15_percent():
    # As the app loads the pair at its default precision: the target's GGUF file on its own
    # blocks, the drafter from its converted folder at "auto" (int4 next to the file's cheap step).
    from engine.models.loading import default_pair
    from engine.models.loading.gguf_sizes import local_variant
    from engine.models.loading.loader import drafter_weights

    paths = default_pair.installed_paths()
    if paths is None:
        pytest.fail("default model pair not installed: run `make setup` first")
    target, drafter = default_pair.gguf_file(default_pair.TARGET), paths[1]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # as the app runs
    measured = measure_steady(["--target", str(target), "--drafter", str(drafter), "--precision", "file",
                               "--context", "2048", "--new-tokens", "16"], env=env)
    held = drafter_weights("auto", "file", "cpu")
    assert measured["drafter_weights"] == held
    e = find_entry("default-offline")
    fit = assess(e, Hardware.from_profile({"ram_gb": 16, "cpu_cores": 2}), "file", 2048, variant=local_variant(target))
    estimate = fit.estimate
    # What stays resident at a start that maps the weight cache (measure_steady): anonymous
    # memory (runtime, activations, K/V, and the int4 layers the fused draft runner copies into
    # huge pages), the GGUF target's resident pages, and the drafter's bf16 file pages its
    # embedding lookups read at every step (its layers there are never read); a drafter whose
    # int4 layers stay mapped from the cache shows them as drafter_cache_end instead.
    # The lookups read rows of the drafter's embedding table only; the kernel maps more of the file
    # where its neighbouring pages sit in the page cache (fault-around: 180 to 290 MiB measured on
    # one machine, by what ran before), clean pages it drops first and that no step reads.
    table = e.drafter_arch.vocab_size * e.drafter_arch.hidden_size * 2  # bf16, tied: one table
    drafter_file = min(measured["drafter_file_end"], table)
    resident = (measured["generate_peak_anon"] + measured["target_file_end"] + drafter_file
                + measured["drafter_cache_end"])
    print(f"\ndefault pair, GGUF target + {held} drafter, 2k context: estimate {estimate.total / 2**20:.0f} MiB "
          f"({ {k: round(v / 2**20) for k, v in estimate.to_dict().items()} }), resident {resident / 2**20:.0f} MiB "
          f"(anonymous peak {measured['generate_peak_anon'] / 2**20:.0f}, target file "
          f"{measured['target_file_end'] / 2**20:.0f}, drafter file {measured['drafter_file_end'] / 2**20:.0f} "
          f"(counted {drafter_file / 2**20:.0f}), "
          f"drafter cache {measured['drafter_cache_end'] / 2**20:.0f}), "
          f"peak RSS {measured['peak_rss'] / 2**20:.0f} MiB")
    assert abs(estimate.total - resident) / resident <= 0.15
    # Never under what stays resident, the picker's promise, within what repeated runs of the
    # probe differ by (anonymous peaks 868 to 923 MiB measured); the fit's headroom covers the rest.
    assert estimate.total >= 0.95 * resident
