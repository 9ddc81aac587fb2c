"""`tandem bench` on the tiny pair: an int8 target next to a bf16 baseline, in one run."""
import json

from engine.cli import main
from engine.testing.tiny_models import save_pair


def test_bench_compares_the_int8_target_with_bf16_plain_decoding(tmp_path, capsys):
    target, drafter = save_pair(tmp_path)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "code-add", "category": "code", "prompt": "def add(a, b):"}) + "\n")
    out = tmp_path / "bench.json"
    code = main(["bench", "--target", str(target), "--drafter-model", str(drafter), "--precision", "int8",
                 "--baseline-precision", "fast", "--prompts", str(prompts), "--json", str(out), "--no-hf",
                 "--no-agreement", "--drafter-head", "full", "--max-new-tokens", "12", "--threads", "1"])
    assert code == 0
    report = json.loads(out.read_text())
    assert report["settings"]["precision"] == "int8" and report["settings"]["baseline_precision"] == "fast"
    [row] = report["prompts"]
    assert row["identical"]  # speculation on the int8 target == its plain decoding
    assert row["baseline_plain"]["new_tokens"] > 0
    summary = report["summary"]
    assert summary["plain_vs_baseline_plain"] > 0 and summary["speculative_tok_per_s"] > 0
    assert "plain vs fast plain" in capsys.readouterr().out


def test_bench_repeats_alternate_and_report_the_median_run(tmp_path):
    target, drafter = save_pair(tmp_path)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "code-add", "category": "code", "prompt": "def add(a, b):"}) + "\n")
    out = tmp_path / "bench.json"
    code = main(["bench", "--target", str(target), "--drafter-model", str(drafter), "--prompts", str(prompts),
                 "--json", str(out), "--no-hf", "--no-agreement", "--drafter-head", "full", "--max-new-tokens", "8",
                 "--threads", "1", "--repeats", "3"])
    assert code == 0
    report = json.loads(out.read_text())
    assert report["settings"]["repeats"] == 3
    [row] = report["prompts"]
    for key in ("plain", "speculative"):
        runs = row[key]["tok_per_s_runs"]
        assert len(runs) == 3 and all(r > 0 for r in runs)
        assert row[key]["tok_per_s"] == sorted(runs)[1]
    assert row["all_runs_identical"] and row["identical"]
    assert row["speedup_vs_plain"] == row["speculative"]["tok_per_s"] / row["plain"]["tok_per_s"]
    # The same runs without their prefill: faster than the whole-run rate, and their own ratio.
    for key in ("plain", "speculative"):
        assert row[key]["decode_tok_per_s"] > row[key]["tok_per_s"]
    assert row["decode_speedup_vs_plain"] == row["speculative"]["decode_tok_per_s"] / row["plain"]["decode_tok_per_s"]
    assert report["summary"]["decode_speedup_vs_plain"] == row["decode_speedup_vs_plain"]
