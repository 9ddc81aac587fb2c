"""The 4-bit device bench runs end to end on tiny shapes on the CPU (a lent GPU or Mac runs the
real ones through scripts/gpu_check.sh)."""
import json

import pytest
import torch

from engine.bench import int4_device_bench


@pytest.fixture(autouse=True)
def one_thread():
    # torch's CPU int4 op waits ~5 ms a call for its second thread on a loaded machine.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_tiny_bench_runs_end_to_end(tmp_path, capsys):
    out = tmp_path / "int4.json"
    assert int4_device_bench.main(["--tiny", "--device", "cpu", "--reps", "1", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "TINY shapes" in text and "parity vs the CPU reference" in text and "host syncs per token" in text
    result = json.loads(out.read_text())
    assert all(p["int4_worst"] <= 1 and p["int8_worst"] <= 1 for p in result["parity"])
    assert all(p["int4_rows_alone_equal"] and p["int8_rows_alone_equal"] for p in result["parity"])  # the CPU ops
    costs = result["costs"]["default pair"]
    assert set(costs["int4_seconds"]) == {str(m) for m in range(1, 10)}
    assert costs["int4_weight_bytes"] < costs["bf16_weight_bytes"] / 2 and costs["int4_bits_per_weight"] == 5.0
    assert abs(costs["memory_fit_int4_bytes"] - costs["int4_weight_bytes"]) / costs["int4_weight_bytes"] < 0.05
    assert result["lossless"]["int4_speculative_equals_plain"]
    assert result["lossless"]["int4_plain_syncs_per_token"] is None  # counted on CUDA only


def test_the_8b_shape_is_llama_3_1_8b():
    s = int4_device_bench.SHAPES_8B
    assert (s["hidden_size"], s["num_hidden_layers"], s["intermediate_size"], s["vocab_size"]) == (4096, 32, 14336, 128256)
    assert s["num_key_value_heads"] == 8 and not s["tie_word_embeddings"]
