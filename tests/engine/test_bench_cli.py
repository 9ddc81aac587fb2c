"""`tandem bench` on the tiny pair: an int8 target next to a bf16 baseline, in one run."""
import json

from engine.cli import main
from engine.tiny_models import save_pair


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
