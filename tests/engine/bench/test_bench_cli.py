"""`tandem bench` on the tiny pair: an int8 target next to a bf16 baseline, in one run."""
import json
from pathlib import Path

import pytest

from engine.bench.prompt_sets import PromptFileError, read_prompts
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
    assert report["complete"] is True  # the last of the reports written as the bench went
    assert report["settings"]["precision"] == "int8" and report["settings"]["baseline_precision"] == "bf16"
    [row] = report["prompts"]
    assert row["identical"]  # speculation on the int8 target == its plain decoding
    assert row["baseline_plain"]["new_tokens"] > 0
    summary = report["summary"]
    assert summary["plain_vs_baseline_plain"] > 0 and summary["speculative_tok_per_s"] > 0
    assert "plain vs bf16 plain" in capsys.readouterr().out  # "fast" is read as bf16


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
    # The same runs without their prefill, and their own ratio. (Whether that rate beats the
    # whole-run rate is timing: on a tiny model a prefill costs about one step, so it varies.)
    for key in ("plain", "speculative"):
        decode_runs = row[key]["decode_tok_per_s_runs"]
        assert len(decode_runs) == 3 and all(r > 0 for r in decode_runs)
        # The median of the decode rates, which need not be the decode rate of the run of median
        # speed: a long prompt's run time is mostly its prefill.
        assert row[key]["decode_tok_per_s"] == sorted(decode_runs)[1]
    assert row["decode_speedup_vs_plain"] == row["speculative"]["decode_tok_per_s"] / row["plain"]["decode_tok_per_s"]
    assert report["summary"]["decode_speedup_vs_plain"] == row["decode_speedup_vs_plain"]


def _prompt_file(tmp_path, lines) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(b"\n".join(line if isinstance(line, bytes) else line.encode() for line in lines) + b"\n")
    return path


GOOD = json.dumps({"id": "a", "category": "code", "prompt": "def add(a, b):"})


@pytest.mark.parametrize("bad, message", [
    ("{not json", ":2: not a JSON object"),
    ("[1, 2]", ":2: each line must be a JSON object"),
    (json.dumps({"id": "b", "prompt": "x"}), ":2: missing category"),
    (json.dumps({"id": "b", "category": "code", "prompt": 3}), ":2: prompt must be a string, not int"),
    (json.dumps({"id": "b", "category": "code", "prompt": "  "}), ":2: the prompt of 'b' is empty"),
    (json.dumps({"id": "a", "category": "code", "prompt": "again"}), ":2: the id 'a' is already used on line 1"),
    (b'{"id": "b", "category": "code", "prompt": "caf\xe9"}', ":2: not valid UTF-8 (byte 0xe9 at column 47)"),
    (json.dumps({"id": "b", "category": "code", "prompt": "bad \udcff"}), ":2: the prompt of 'b' is not valid UTF-8"),
])
def test_a_bad_prompt_file_is_refused_with_its_file_and_line(tmp_path, bad, message):
    path = _prompt_file(tmp_path, [GOOD, bad, GOOD.replace('"a"', '"c"')])
    with pytest.raises(PromptFileError) as caught:
        read_prompts(path)
    assert str(caught.value).startswith(str(path)) and message in str(caught.value)


def test_bench_refuses_a_bad_prompt_file_before_loading_a_model(tmp_path, capsys):
    path = _prompt_file(tmp_path, [GOOD, GOOD])
    code = main(["bench", "--prompts", str(path), "--target", str(tmp_path / "absent")])
    assert code == 2
    assert f"{path}:2: the id 'a' is already used on line 1" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["missing-folder/report.json", "a-folder"])
def test_bench_checks_its_report_path_before_loading_a_model(tmp_path, capsys, where):
    (tmp_path / "a-folder").mkdir()
    code = main(["bench", "--json", str(tmp_path / where), "--target", str(tmp_path / "absent")])
    err = capsys.readouterr().err
    assert code == 2 and "cannot write the report to" in err, err


def test_a_failure_later_in_the_bench_keeps_the_earlier_prompts_results(tmp_path, capsys):
    target, drafter = save_pair(tmp_path)  # a 512-token window
    path = _prompt_file(tmp_path, [GOOD, json.dumps({"id": "too-long", "category": "prose", "prompt": "hello world " * 400})])
    out = tmp_path / "bench.json"
    code = main(["bench", "--target", str(target), "--drafter-model", str(drafter), "--prompts", str(path), "--json", str(out),
                 "--no-hf", "--no-agreement", "--drafter-head", "full", "--max-new-tokens", "6", "--threads", "1"])
    assert code == 1
    assert "context window is 512" in capsys.readouterr().err
    report = json.loads(out.read_text())
    assert report["complete"] is False and report["prompts_planned"] == 2
    [row] = report["prompts"]
    assert row["id"] == "a" and row["plain"]["new_tokens"] > 0
    assert report["summary"]["plain_tok_per_s"] > 0
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]  # the atomic writes left nothing behind


def test_the_bench_warms_up_untimed_before_its_first_timed_run(tmp_path):
    """One plain and one speculative generation of the first prompt run before anything is timed,
    and none of their tokens is counted: the first timed runs make exactly the tokens asked for."""
    from engine.bench.suite import WARM_UP_TOKENS, run_bench
    from engine.session.session import Session

    target, drafter = save_pair(tmp_path)
    session = Session.load(target, drafter, "bf16", "cpu")
    prompts = [{"id": "code-add", "category": "code", "prompt": "def add(a, b):"},
               {"id": "code-sub", "category": "code", "prompt": "def sub(a, b):"}]
    calls = []  # (kind, prompt ids, tokens asked), in the order the bench asked for them
    for kind in ("plain", "speculative"):
        real = getattr(session, kind)

        def recorded(ids, settings, *rest, _kind=kind, _real=real):
            calls.append((_kind, list(ids), settings.max_new_tokens))
            return _real(ids, settings, *rest)

        setattr(session, kind, recorded)
    report = run_bench(session, prompts, 6, hf=False, agreement=False, progress=lambda _: None)
    first = session.encode(prompts[0]["prompt"])
    timed = [i for i, (_, _, n) in enumerate(calls) if n == 6]
    warm = calls[:timed[0]]
    assert ("plain", first, WARM_UP_TOKENS) in warm and ("speculative", first, WARM_UP_TOKENS) in warm
    assert report["settings"]["warm_up"] == {**report["settings"]["warm_up"], "ran": True,
                                             "plain_tokens": WARM_UP_TOKENS, "speculative_tokens": WARM_UP_TOKENS}
    row = report["prompts"][0]
    assert row["plain"]["new_tokens"] == row["speculative"]["new_tokens"] == 6  # no warm-up token counted
    assert row["identical"]


def _sampled_bench(tmp_path, *extra) -> dict:
    target, drafter = save_pair(tmp_path)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "code-add", "category": "code", "prompt": "def add(a, b):"}) + "\n"
                       + json.dumps({"id": "story", "category": "prose", "prompt": "Once upon a time"}) + "\n")
    out = tmp_path / "bench.json"
    code = main(["bench", "--target", str(target), "--drafter-model", str(drafter), "--prompts", str(prompts),
                 "--json", str(out), "--no-hf", "--no-agreement", "--drafter-head", "full", "--max-new-tokens", "10",
                 "--threads", "1", "--mode", "sample", "--temperature", "1.0", *extra])
    assert code == 0
    return json.loads(out.read_text())


def test_a_sampled_bench_reports_every_seed_and_their_geometric_mean(tmp_path, capsys):
    from engine.bench.summary import geomean

    report = _sampled_bench(tmp_path, "--seeds", "3,11,12", "--repeats", "2")
    settings = report["settings"]
    assert settings["mode"] == "sample" and settings["temperature"] == 1.0 and settings["seeds"] == [3, 11, 12]
    assert settings["hf"] is False and settings["background_load"] is None and settings["cpu_kernels"]
    ratios = []
    for row in report["prompts"]:
        assert [s["seed"] for s in row["seeds"]] == [3, 11, 12]
        for s in row["seeds"]:
            assert s["plain"]["new_tokens"] > 0 and s["speculative"]["new_tokens"] > 0
            assert s["decode_speedup_vs_plain"] == s["speculative"]["decode_tok_per_s"] / s["plain"]["decode_tok_per_s"]
            ratios.append(s["decode_speedup_vs_plain"])
        # The same seed twice (the repeats): the same output. Different seeds: different samples.
        assert row["plain_repeats_identical"] and all(s["plain"]["repeats_identical"] for s in row["seeds"])
        assert row["seeds_differ"]
        assert len({tuple(s["plain"]["token_ids"]) for s in row["seeds"]}) > 1
        assert row["identical"] is None  # sampled outputs are not compared token for token
        assert row["decode_speedup_vs_plain"] == pytest.approx(geomean([s["decode_speedup_vs_plain"] for s in row["seeds"]]))
        drafted = sum(s["speculative"]["drafted"] for s in row["seeds"])
        accepted = sum(s["speculative"]["accepted"] for s in row["seeds"])
        # (The adaptive draft length may switch drafting off for a whole prompt on the tiny pair.)
        assert row["speculative"]["acceptance"] == pytest.approx(accepted / drafted if drafted else 0.0)
    summary = report["summary"]
    assert len(ratios) == 6
    # The geometric mean over prompts and seeds, from the per-seed rows, with its spread.
    assert summary["decode_speedup_vs_plain"] == pytest.approx(geomean(ratios))
    spread = summary["decode_speedup_spread"]
    assert spread["n"] == 6 and spread["geomean"] == pytest.approx(geomean(ratios))
    assert spread["min"] == min(ratios) and spread["max"] == max(ratios)
    assert spread["ci95"][0] <= spread["geomean"] <= spread["ci95"][1]
    assert set(summary["decode_speedup_by_seed"]) == {"3", "11", "12"}
    assert summary["identical_fraction"] is None
    by_pos, drafted = summary["acceptance_by_position"], summary["drafted_by_position"]
    assert len(by_pos) == len(drafted) and all(0 <= a <= 1 for a in by_pos)
    firsts = [s["speculative"]["drafted_at"][0] for r in report["prompts"] for s in r["seeds"] if s["speculative"]["drafted_at"]]
    assert drafted[:1] == ([sum(firsts)] if firsts else [])
    out = capsys.readouterr().out
    assert "decode speedup (3 seeds at T=1): geometric mean" in out and "acceptance by draft position:" in out


def test_a_seed_count_means_seeds_from_zero_and_the_same_seed_samples_the_same(tmp_path):
    first = _sampled_bench(tmp_path / "a", "--seeds", "2")
    again = _sampled_bench(tmp_path / "b", "--seeds", "2")
    assert first["settings"]["seeds"] == [0, 1]
    for one, two in zip(first["prompts"], again["prompts"]):  # another process, the same seeds: the same samples
        assert [s["plain"]["token_ids"] for s in one["seeds"]] == [s["plain"]["token_ids"] for s in two["seeds"]]


def test_a_greedy_bench_keeps_its_report_and_adds_the_spread(tmp_path):
    target, drafter = save_pair(tmp_path)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "code-add", "category": "code", "prompt": "def add(a, b):"}) + "\n")
    out = tmp_path / "bench.json"
    assert main(["bench", "--target", str(target), "--drafter-model", str(drafter), "--prompts", str(prompts),
                 "--json", str(out), "--no-hf", "--no-agreement", "--drafter-head", "full", "--max-new-tokens", "8",
                 "--threads", "1"]) == 0
    report = json.loads(out.read_text())
    assert report["settings"]["mode"] == "greedy" and report["settings"]["seeds"] is None
    [row] = report["prompts"]
    assert "seeds" not in row and row["identical"] is True and report["summary"]["identical_fraction"] == 1.0
    spread = report["summary"]["decode_speedup_spread"]
    assert spread["n"] == 1 and spread["geomean"] == pytest.approx(row["decode_speedup_vs_plain"])
    assert row["speculative"]["acceptance_by_position"] == report["summary"]["acceptance_by_position"]


def test_a_bench_under_background_load_records_it(tmp_path):
    report = _sampled_bench(tmp_path, "--seeds", "1,2", "--background-load", "1", "--memory-pressure", "0.05")
    load = report["settings"]["background_load"]
    assert load["threads"] == 1 and load["memory_gb"] == 0.05
    assert load["busy_cpu_seconds"] > 0 and load["memory_rss_gb"] >= 0.045


@pytest.mark.parametrize("flags, message", [
    (["--seeds", "3"], "--seeds applies to --mode sample"),
    (["--mode", "sample", "--seeds", "0"], "--seeds N must be at least 1"),
    (["--mode", "sample", "--seeds", "1,1"], "distinct seeds"),
    (["--mode", "sample", "--seeds", "a,b"], "--seeds takes a count N or a list"),
    (["--mode", "sample", "--temperature", "0"], "temperature must be > 0"),
    (["--background-load", "-1"], "--background-load must be >= 0"),
    (["--memory-pressure", "-2"], "--memory-pressure must be >= 0"),
    (["--memory-left", "-1"], "--memory-left takes a size >= 0 GB"),
    (["--memory-left", "1", "--memory-pressure", "2"], "not beside --memory-pressure"),
])
def test_bad_sampling_and_load_flags_are_refused_before_loading_a_model(tmp_path, capsys, flags, message):
    code = main(["bench", "--target", str(tmp_path / "absent"), *flags])
    err = capsys.readouterr().err
    assert code == 2 and message in err, err


def test_compare_says_its_warm_up_ran_before_either_lane_was_timed(tmp_path, capsys):
    target, drafter = save_pair(tmp_path)
    code = main(["compare", "def add(a, b):", "--target", str(target), "--drafter-model", str(drafter),
                 "--drafter-head", "full", "--max-new-tokens", "6"])
    out = capsys.readouterr().out
    assert code == 0
    assert "warm-up: both lanes ran a few tokens untimed first" in out
    assert "speedup: " in out and "(after the first token: " in out


def test_a_seed_whose_speculative_run_stops_at_its_first_token_leaves_the_prompts_ratio_its_seeds():
    """A sampled speculative run draws another text than plain's and may stop after one token
    (no decode rate): that seed has no ratio, and the prompt's ratio stays the geometric mean of
    the others' (each lane's geometric mean dropping its zero alone moved it off)."""
    from engine.bench.suite import _decode_ratio, _pool_seeds
    from engine.bench.summary import geomean

    def run(decode: float, new_tokens: int) -> dict:
        stats = {"new_tokens": new_tokens, "seconds": 1.0, "target_passes": new_tokens, "drafted": 0, "accepted": 0,
                 "draft_seconds": 0.0, "verify_seconds": 1.0}
        return {"tok_per_s": float(new_tokens), "decode_tok_per_s": decode, "ttft_s": 0.1, "drafted_at": [],
                "accepted_at": [], "stats": stats}

    lanes = [(run(20.0, 10), run(30.0, 10)), (run(25.0, 10), run(0.0, 1)), (run(16.0, 10), run(18.0, 10))]
    seeds = [{"plain": p, "speculative": s, "decode_speedup_vs_plain": _decode_ratio(p, s)} for p, s in lanes]
    assert seeds[1]["decode_speedup_vs_plain"] is None
    plain, spec = _pool_seeds(seeds)
    assert spec["decode_tok_per_s"] / plain["decode_tok_per_s"] == pytest.approx(geomean([30 / 20, 18 / 16]))
    assert plain["new_tokens"] == 30 and spec["new_tokens"] == 21  # counts still pool every seed
