"""Does serving over HTTP cost speed? The same greedy prompt decoded in-process and through
`tandem serve` (a real uvicorn server on loopback, streamed SSE), alternating, in one run.

    python scripts/serve_bench.py [--prompt TEXT] [--repeats 3] [--max-new-tokens 128]
                                  [--precision bf16] [model options of `tandem compare`] [--json out.json]

Per run it prints tokens per second two ways: end to end (new tokens over the wall time from
the call / request to the last token, as a user sees it) and the engine's own rate after the
first token; then the medians and the ratio server / in-process. Both paths run the same
Session, drafter and settings; the outputs must be identical.
"""
from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.cli.common import load_session, model_options  # noqa: E402

DEFAULT_PROMPT = "Write a Python function that checks whether a string is a palindrome, with a docstring and tests."


def in_process(session, prompt: str, settings, drafter: str) -> dict:
    from engine.core.events import Failed, Finished

    start = time.perf_counter()
    ids = session.encode(prompt)
    for event in session.speculative(ids, settings, drafter):
        if isinstance(event, Failed):
            raise RuntimeError(event.error)
        if isinstance(event, Finished):
            wall = time.perf_counter() - start
            return {"text": event.text, "tokens": event.stats.new_tokens, "wall_s": wall,
                    "tok_per_s": event.stats.new_tokens / wall, "decode_tok_per_s": event.stats.decode_tok_per_s,
                    "drafted": event.stats.drafted, "accepted": event.stats.accepted}
    raise RuntimeError("no result")


def served(url: str, prompt: str, max_tokens: int, drafter: str) -> dict:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    body = {"messages": [{"role": "user", "content": prompt}], "temperature": 0, "max_tokens": max_tokens,
            "stream": True, "stream_options": {"include_usage": True}, "speculative": {"drafter": drafter}}
    start = time.perf_counter()
    conn = http.client.HTTPConnection(host, int(port), timeout=600)
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    text, usage = [], None
    for raw in response:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if chunk.get("usage"):
            usage = chunk
        for choice in chunk["choices"]:
            text.append(choice["delta"].get("content") or "")
    wall = time.perf_counter() - start
    conn.close()
    timings = usage["timings"]
    tokens = usage["usage"]["completion_tokens"]
    return {"text": "".join(text), "tokens": tokens, "wall_s": wall, "tok_per_s": tokens / wall,
            "decode_tok_per_s": timings["predicted_per_second"], "drafted": timings["draft_n"],
            "accepted": timings["draft_n_accepted"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompt", default=DEFAULT_PROMPT)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs of each path first (first-use costs)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--json", type=Path, help="write the runs and medians here")
    model_options(parser)
    args = parser.parse_args()

    import torch

    from engine.core.settings import DecodeSettings
    from engine.serving.server import ServerConfig, run_in_thread
    from engine.session.compare import warm_up

    if args.threads:
        torch.set_num_threads(args.threads)
    session = load_session(args, need_drafter=args.drafter == "model")
    warm_up(session, args.drafter)
    settings = DecodeSettings(max_new_tokens=args.max_new_tokens)
    runs = {"in_process": [], "server": []}
    with run_in_thread(session, ServerConfig(port=0)) as handle:
        worker = handle.worker
        for _ in range(args.warmup):
            in_process(session, args.prompt, settings, args.drafter)
            served(handle.url, args.prompt, args.max_new_tokens, args.drafter)
        for r in range(args.repeats):
            # Alternate which goes first: a machine that slows down over the run favours neither.
            order = ("in_process", "server") if r % 2 == 0 else ("server", "in_process")
            for kind in order:
                if kind == "in_process":
                    assert worker.idle  # between requests: the session is used by one caller at a time
                    run = in_process(session, args.prompt, settings, args.drafter)
                else:
                    run = served(handle.url, args.prompt, args.max_new_tokens, args.drafter)
                runs[kind].append(run)
                print(f"run {r + 1} {kind:<10} {run['tokens']:4d} tokens  {run['tok_per_s']:6.2f} tok/s end to end"
                      f"  {run['decode_tok_per_s']:6.2f} after the first  drafted {run['drafted']}"
                      f" accepted {run['accepted']}", flush=True)
    texts = {run["text"] for kind in runs for run in runs[kind]}
    median = {kind: {key: statistics.median(run[key] for run in runs[kind]) for key in ("tok_per_s", "decode_tok_per_s")}
              for kind in runs}
    # Each repeat's two runs are neighbours in time: their ratio cancels most of a busy machine's drift.
    paired = [s["tok_per_s"] / p["tok_per_s"] for s, p in zip(runs["server"], runs["in_process"])]
    ratio = median["server"]["tok_per_s"] / median["in_process"]["tok_per_s"]
    decode_ratio = median["server"]["decode_tok_per_s"] / median["in_process"]["decode_tok_per_s"]
    print(f"\n{session.target.name} ({session.precision}), drafter {args.drafter}, {args.max_new_tokens} new tokens,"
          f" {args.repeats} runs each, torch threads {torch.get_num_threads()}")
    for kind in runs:
        rates = sorted(run["tok_per_s"] for run in runs[kind])
        print(f"{kind:<10} end-to-end tok/s runs: " + " ".join(f"{r:.2f}" for r in rates))
    print(f"median tok/s end to end:        in-process {median['in_process']['tok_per_s']:.2f}"
          f"  server {median['server']['tok_per_s']:.2f}  ratio {ratio:.3f}")
    print(f"median tok/s after first token: in-process {median['in_process']['decode_tok_per_s']:.2f}"
          f"  server {median['server']['decode_tok_per_s']:.2f}  ratio {decode_ratio:.3f}")
    print("server / in-process per repeat: " + " ".join(f"{r:.3f}" for r in paired)
          + f"  median {statistics.median(paired):.3f}")
    print("outputs: identical" if len(texts) == 1 else f"outputs: {len(texts)} different texts")
    if args.json:
        args.json.write_text(json.dumps({"settings": {"prompt": args.prompt, "precision": session.precision,
                                                      "drafter": args.drafter, "max_new_tokens": args.max_new_tokens,
                                                      "threads": torch.get_num_threads()},
                                         "runs": runs, "median": median, "ratio": ratio,
                                         "paired_ratios": paired, "median_paired_ratio": statistics.median(paired), "decode_ratio": decode_ratio,
                                         "identical": len(texts) == 1}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
