"""One remote-client call in a process of its own, for the hostile-server tests: how much the
call grew the process is only measurable where nothing else allocates.

    python -m tests.engine.remote.remote_probe URL models|metrics|stream

prints one JSON line: the call's error (type and text, or null), the growth of the process's
peak RSS over its RSS just before the call, in MB, the call's seconds and, for a stream, how
many chunks of text it yielded. The stream asks for max_tokens=16.
"""
from __future__ import annotations

import json
import resource
import sys
import time

import psutil

MAX_TOKENS = 16


def peak_rss() -> int:
    """The process's peak RSS in bytes: Linux's VmHWM, which starts afresh at exec (getrusage's
    ru_maxrss does not: it keeps the peak of the process that forked this one, pytest's)."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux, bytes on macOS


def main(url: str, call: str) -> None:
    from engine.remote.client import Chunk, RemoteClient, RemoteEndpoint

    client = RemoteClient(RemoteEndpoint(url))
    before = psutil.Process().memory_info().rss
    error = None
    chunks = 0
    start = time.monotonic()
    try:
        if call == "models":
            client.list_models()
        elif call == "metrics":
            client.metrics_text()
        else:
            for item in client.stream_chat("m", [{"role": "user", "content": "hi"}], max_tokens=MAX_TOKENS):
                chunks += isinstance(item, Chunk)
    except Exception as exc:  # the error is the result
        error = {"type": type(exc).__name__, "text": str(exc)[:300]}
    seconds = time.monotonic() - start
    peak = peak_rss()
    print(json.dumps({"error": error, "growth_mb": round(max(0, peak - before) / 1e6, 1),
                      "seconds": round(seconds, 1), "chunks": chunks}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
