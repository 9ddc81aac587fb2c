"""Bad input is refused with one line and status 2, before any model loads.

The CLI tests point --target at a folder that does not exist: a check that ran after loading
would fail on that folder instead, so each test also proves the order."""
import json
import logging
import os
import subprocess
import sys

import pytest

from engine.cli import main
from engine.core.settings import DecodeSettings, DrafterOptions, InvalidRequest, check_prompt
from engine.testing.tiny_models import save_pair
from tests.paths import REPO_ROOT as ROOT

NOT_BYTES = os.fsdecode(b"ab\xffcd")  # what Python makes of argv bytes that are not UTF-8


@pytest.mark.parametrize("fields, message", [
    ({"mode": "sample", "temperature": float("nan")}, "temperature must be a finite number"),
    ({"mode": "sample", "temperature": float("inf")}, "temperature must be a finite number"),
    ({"temperature": -0.5}, "temperature must be >= 0"),
    ({"mode": "sample", "temperature": 0.0}, "temperature must be > 0 when sampling"),
    ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
    ({"top_p": 1.01}, r"top_p must be in \(0, 1\]"),
    ({"top_p": float("nan")}, "top_p must be a finite number"),
    ({"top_k": -1}, "top_k must be >= 0"),
    ({"seed": -1}, "seed must be between 0 and 2\\*\\*64 - 1"),
    ({"seed": 2**64}, "seed must be between 0 and 2\\*\\*64 - 1"),
    ({"max_new_tokens": 0}, "max_new_tokens must be at least 1"),
    ({"max_new_tokens": -5}, "max_new_tokens must be at least 1"),
    ({"stop_strings": ("",)}, "stop string must be non-empty"),
    ({"stop_strings": (NOT_BYTES,)}, "not valid UTF-8"),
])
def test_decode_settings_refuse_what_no_model_can_use(fields, message):
    with pytest.raises(InvalidRequest, match=message):
        DecodeSettings(**fields)


def test_decode_settings_take_the_edges_of_their_ranges():
    DecodeSettings(mode="sample", temperature=1e-3, top_p=1.0, seed=2**64 - 1, max_new_tokens=1)
    DecodeSettings(seed=0, temperature=0.0)  # greedy ignores the temperature; 0 is a fine value for it


def test_drafter_options_refuse_a_non_finite_confidence():
    with pytest.raises(InvalidRequest, match="min_confidence"):
        DrafterOptions(min_confidence=float("nan"))


@pytest.mark.parametrize("prompt, message", [
    ("", "is empty"),
    ("   \n\t", "is empty"),
    (NOT_BYTES, r"not valid UTF-8 \(byte 0xff at character 3\)"),
    ("ok \ud800 no", r"not valid UTF-8 \(U\+D800 at character 4\)"),
])
def test_check_prompt_refuses_empty_and_undecodable_text(prompt, message):
    with pytest.raises(InvalidRequest, match=message):
        check_prompt(prompt)


def test_check_prompt_takes_any_real_text():
    assert check_prompt("Résumé 東京 🙂") == "Résumé 東京 🙂"


def _usage_error(capsys, argv) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("tandem: error: "), err
    return lines[0]


@pytest.mark.parametrize("args, message", [
    (["compare", ""], "the prompt is empty"),
    (["compare", NOT_BYTES], "not valid UTF-8 (byte 0xff"),
    (["compare", "hi", "--mode", "sample", "--temperature", "nan"], "temperature must be a finite number"),
    (["compare", "hi", "--mode", "sample", "--temperature", "inf"], "temperature must be a finite number"),
    (["compare", "hi", "--temperature", "-1"], "temperature must be >= 0"),
    (["compare", "hi", "--top-p", "0"], "top_p must be in (0, 1]"),
    (["compare", "hi", "--top-p", "2"], "top_p must be in (0, 1]"),
    (["compare", "hi", "--seed", "-1"], "seed must be between 0 and 2**64 - 1"),
    (["compare", "hi", "--seed", str(2**64)], "seed must be between 0 and 2**64 - 1"),
    (["compare", "hi", "--max-new-tokens", "0"], "max_new_tokens must be at least 1"),
    (["compare", "hi", "--min-confidence", "nan"], "min_confidence"),
    (["bench", "--limit", "-1"], "limit must be >= 0"),
    (["bench", "--repeats", "0"], "--repeats must be at least 1"),
    (["bench", "--max-new-tokens", "0"], "max_new_tokens must be at least 1"),
    (["bench", "--category", "nosuch"], "no prompts of category 'nosuch'; the prompt file has code, math, prose, qa, rewrite"),
])
def test_the_cli_refuses_bad_input_before_loading_anything(tmp_path, capsys, args, message):
    absent = str(tmp_path / "no-model-here")
    line = _usage_error(capsys, [*args, "--target", absent, "--drafter-model", absent])
    assert message in line


def test_argv_bytes_that_are_not_utf8_are_refused_by_the_real_command(tmp_path):
    absent = str(tmp_path / "no-model-here")
    out = subprocess.run([sys.executable, "-m", "engine.cli", "compare", b"ab\xffcd", "--target", absent],
                         cwd=ROOT, capture_output=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr.decode().strip() == "tandem: error: the prompt is not valid UTF-8 (byte 0xff at character 3)"


def test_models_never_recommends_a_context_past_the_models_window(tmp_path, capsys):
    machine = tmp_path / "machine.json"
    machine.write_text(json.dumps({"ram_gb": 512, "gpus": [], "disk_free_gb": 1000}))
    assert main(["models", "--json", "--context", "40000", "--hardware", str(machine)]) == 0
    rows = json.loads(capsys.readouterr().out)["models"]
    short = [r for r in rows if r["id"].startswith("qwen2.5-coder")]  # 32768-token windows
    assert short and all(r["fit"] == "none" and not r["recommended"] for r in short)
    assert all("context window is 32768 tokens, below the 40000 asked" in r["reason"] for r in short)
    [best] = [r for r in rows if r["recommended"]]
    assert best["context"] == 40000 and not best["id"].startswith("qwen2.5")


def test_models_refuses_a_context_below_one(tmp_path, capsys):
    line = _usage_error(capsys, ["models", "--context", "0"])
    assert "--context must be at least 1" in line


def test_a_prompt_past_the_window_gives_its_message_without_a_traceback(tmp_path, capsys, caplog):
    target, drafter = save_pair(tmp_path)  # a 512-token window
    long_prompt = "hello world " * 400
    with caplog.at_level(logging.WARNING):
        code = main(["compare", long_prompt, "--target", str(target), "--drafter-model", str(drafter),
                     "--max-new-tokens", "4", "--drafter-head", "full"])
    err = capsys.readouterr().err
    assert code == 1
    assert "the model's context window is 512; shorten it" in err and "Traceback" not in err
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]


def test_a_missing_target_tokenizer_is_named_not_called_a_drafter_mismatch(tmp_path):
    from engine.session.session import Session

    target, drafter = save_pair(tmp_path)
    (target / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError) as caught:
        Session.load(target, drafter, "bf16", "cpu")
    assert str(target / "tokenizer.json") in str(caught.value)
    assert "drafter" not in str(caught.value)


def test_a_truncated_weight_file_is_named_before_loading(tmp_path):
    from engine.models.loading.loader import DamagedModelFiles, load_model

    target, _ = save_pair(tmp_path)
    weights = target / "model.safetensors"
    size = weights.stat().st_size
    os.truncate(weights, size - 1000)
    with pytest.raises(DamagedModelFiles) as caught:
        load_model(target, "bf16", "cpu")
    assert str(weights) in str(caught.value) and f"{size:,}" in str(caught.value)


def test_chat_messages_are_checked_like_a_prompt(tmp_path):
    from engine.session.session import Session

    target, _ = save_pair(tmp_path)
    session = Session.load(target, None, "bf16", "cpu")
    with pytest.raises(InvalidRequest, match="the user message is not valid UTF-8"):
        session.encode([{"role": "user", "content": NOT_BYTES}])
    with pytest.raises(InvalidRequest, match="conversation is empty"):
        session.encode([])
