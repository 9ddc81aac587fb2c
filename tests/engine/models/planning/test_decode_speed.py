"""The picker's plain-speed prediction: bytes read per token at the precision over the bandwidth
measured for that precision and CPU class (engine/models/planning/decode_speed.py)."""
import pytest

from engine.models.planning.catalog import find_entry
from engine.models.planning.decode_speed import cpu_class, predict_plain_rate
from engine.models.planning.hardware import Hardware
from engine.models.planning.memory_fit import estimate_memory

TWO_CORES = Hardware.from_profile({"ram_gb": 16, "cpu_cores": 2})
# Plain tok/s of the default 1.5B target on 2 cores, as docs/benchmarks recorded them.
MEASURED = {("avx512_vnni", "bf16"): 8.3, ("avx512_vnni", "int8"): 18.82, ("avx512_vnni", "int4"): 32.89,
            ("avx2", "bf16"): 4.2, ("avx2", "int8"): 8.5, ("avx2", "int4"): 25.0}


@pytest.mark.parametrize("klass, precision", sorted(MEASURED))
def test_the_default_target_is_predicted_near_what_was_measured(klass, precision):
    weights = estimate_memory(find_entry("default-offline"), precision, 4096, "cpu").weights
    hint = predict_plain_rate(TWO_CORES, weights, precision, klass)
    assert hint.tok_s == pytest.approx(MEASURED[klass, precision], rel=0.1)
    assert precision in hint.source and "docs/benchmarks" in hint.source


@pytest.mark.parametrize("klass, measured", [("avx512_vnni", 31.5), ("avx2", 19.8)])
def test_the_default_gguf_target_is_predicted_near_what_was_measured(klass, measured):
    """Precision "file" (the default): the Q4_K_M file's 0.98 GB resident, plain decode measured
    29.4-33.6 tok/s on the VNNI machine and 19.8 on the AVX2 one (docs/benchmarks)."""
    hint = predict_plain_rate(TWO_CORES, 980_000_000, "file", klass)
    assert hint.tok_s == pytest.approx(measured, rel=0.1)


def test_int4_on_two_cores_is_not_the_16_bit_figure():
    entry = find_entry("default-offline")
    rates = {p: predict_plain_rate(TWO_CORES, estimate_memory(entry, p, 4096, "cpu").weights, p, "avx2").tok_s
             for p in ("bf16", "int4")}
    assert rates["int4"] > 5 * rates["bf16"]


def test_unknown_cores_give_no_figure_and_the_class_reads_cpuinfo(tmp_path):
    assert predict_plain_rate(Hardware.from_profile({"ram_gb": 16}), 10**9, "bf16") is None
    info = tmp_path / "cpuinfo"
    info.write_text("flags\t: fpu avx2 avx512f avx512_vnni\n")
    assert cpu_class.__wrapped__(info) == "avx512_vnni"
    info.write_text("flags\t: fpu avx2\n")
    assert cpu_class.__wrapped__(info) == "avx2"
    assert cpu_class.__wrapped__(tmp_path / "missing") == "avx2"
