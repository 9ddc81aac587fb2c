"""The GPU benchmark runs end to end on tiny shapes on the CPU (the lent GPU runs the real ones)."""
import json

from engine.bench import gpu_bench


def test_tiny_bench_runs_and_projects(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert gpu_bench.main(["--tiny", "--dtypes", "fp32", "--reps", "1", "--device", "cpu", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "TINY shapes" in text and "projected speedup" in text and "verify, k=4" in text
    result = json.loads(out.read_text())
    row = result["by_dtype"]["fp32"]
    assert set(row["target_seconds"]) == {"1", "2", "3", "4"}
    assert row["draft_seconds_per_token"] > 0
    assert {"reference", "mps"} <= set(result["verify_seconds"])
    # Acceptance comes from the CPU benchmark runs in docs/benchmarks (exact = fp32).
    assert row["acceptance_source"].startswith("docs/benchmarks")
    assert all(p["speedup"] >= 1.0 for p in row["projection"].values())


def test_projection_math():
    assert gpu_bench.expected_tokens(1.0, 4) == 5.0
    assert abs(gpu_bench.expected_tokens(0.5, 2) - 1.75) < 1e-12
    # Verification free, drafting free, everything accepted: k+1 tokens per pass.
    t = {m: 1.0 for m in range(1, 10)}
    assert gpu_bench.project(1.0, t, 0.0, 0.0) == (8, 9.0)
    # Drafting as dear as the target never pays.
    assert gpu_bench.project(0.9, t, 1.0, 0.0) == (0, 1.0)


def test_real_shapes_match_the_default_pair():
    target, drafter = gpu_bench.SHAPES["target"], gpu_bench.SHAPES["drafter"]
    assert target["hidden_size"] // target["num_attention_heads"] == 128
    assert (target["num_hidden_layers"], target["intermediate_size"], target["vocab_size"]) == (28, 8960, 151936)
    assert (drafter["hidden_size"], drafter["num_hidden_layers"], drafter["num_attention_heads"]) == (896, 24, 14)
    assert drafter["tie_word_embeddings"] and drafter["vocab_size"] == target["vocab_size"]
