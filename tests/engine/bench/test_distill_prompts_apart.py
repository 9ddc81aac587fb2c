"""The distillation prompts never repeat a bench prompt: a drafter trained on the bench's own
replies would be measured on what it learnt by heart."""
import difflib

from engine.bench.prompt_sets import read_prompts
from engine.cli.distill import DEFAULT_PROMPTS
from engine.core.paths import RESOURCES


def test_no_bench_prompt_is_among_the_distillation_prompts():
    distill = [p["prompt"].lower() for p in read_prompts(DEFAULT_PROMPTS)]
    for bench_file in sorted((RESOURCES / "prompts").glob("*.jsonl")):
        if bench_file == DEFAULT_PROMPTS:
            continue
        for prompt in read_prompts(bench_file):
            closest = max(difflib.SequenceMatcher(None, prompt["prompt"].lower(), d).ratio() for d in distill)
            assert closest < 0.8, (bench_file.name, prompt["id"])
