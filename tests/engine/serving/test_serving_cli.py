"""`tandem serve` as a user runs it: a process that loads the models, prints its URL, answers,
and stops cleanly on Ctrl-C or a service manager's SIGTERM."""
import os
import re
import signal
import subprocess
import sys
import threading

import pytest

from engine.testing.tiny_models import save_pair
from tests.engine.serving.client import call, chat


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_tandem_serve_prints_its_url_answers_and_stops_on_ctrl_c(tmp_path, sig):
    target, _ = save_pair(tmp_path)
    # Prompt lookup: no draft model to load (the drafter's int8 kernels would only slow the start).
    cmd = [sys.executable, "-m", "engine", "serve", "--target", str(target), "--drafter", "lookup",
           "--port", "0", "--precision", "fp32", "--max-new-tokens", "5"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    timer = threading.Timer(120, proc.kill)  # a hang fails the test instead of blocking the suite
    timer.start()
    try:
        line = proc.stdout.readline()
        match = re.search(r"serving (\S+) at (http://127\.0\.0\.1:\d+)/v1", line)
        assert match, (line, proc.stderr.read() if proc.poll() is not None else "")
        model, url = match.groups()
        assert model == "tiny-target"
        assert call(url, "GET", "/v1/models").json()["data"][0]["id"] == "tiny-target"
        reply = chat(url, temperature=0)  # no max_tokens: the server's default (--max-new-tokens 5)
        assert reply.status == 200 and reply.json()["usage"]["completion_tokens"] <= 5
        assert reply.json()["timings"]["drafter"] == "lookup"
        proc.send_signal(sig)
        try:
            code = proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail(f"still running 60 s after {sig.name}; it wrote:\n{proc.stderr.read()[-3000:]}")
        err = proc.stderr.read()
        assert code == 0, err[-3000:]
        assert "stopping" in err
        assert "Say hi." not in err  # prompts stay out of the log by default
        assert re.search(r"chatcmpl-\w+ (max_new_tokens|eos): \d+ prompt \+ \d+ new tokens", err), err
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
        proc.stderr.close()
