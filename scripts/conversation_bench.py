"""A growing coding conversation through `tandem serve`, and through llama.cpp's llama-server on
the same GGUF files, in one run: time to first token per turn, as a chat user feels it.

    python scripts/conversation_bench.py [--llama-cpp /tmp/peer/build] [--threads 2]
        [--max-tokens 96] [--tandem speculative plain] [--peer-draft-max 0 5] [--json out.json]

The conversation (resources/prompts/conversation.json) pastes an 80-line module and then asks
for three changes; each server's own replies go back into its history, as in a chat app. Every
request goes through the official `openai` client, streamed, greedy. Per turn: prompt tokens,
the tokens the server says it reused (usage.prompt_tokens_details.cached_tokens, or llama.cpp's
timings.cache_n), time to first token, reply tokens and the decode rate after the first token.

Each server is a fresh process started by this script and stopped after its conversation, one
at a time, with the same thread count (llama-server: -t and -td; Tandem: torch's threads).
llama-server is a benchmark peer only (engine/bench/llamacpp.BUILD_HINT says how to build it,
with the llama-server target).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONVERSATION = ROOT / "resources" / "prompts" / "conversation.json"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, process: subprocess.Popen, timeout: float = 900) -> None:
    """Until GET /v1/models answers 200 (llama-server answers 503 while it loads)."""
    import http.client

    host, port = url.removeprefix("http://").rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode} before it was ready")
        try:
            conn = http.client.HTTPConnection(host, int(port), timeout=5)
            conn.request("GET", "/v1/models")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} was not ready after {timeout:.0f} s")


def converse(url: str, doc: dict, max_tokens: int, extra_body: dict | None, label: str) -> list[dict]:
    """The conversation's turns, each with its reply fed back; one row of figures per turn."""
    from openai import OpenAI

    client = OpenAI(base_url=url + "/v1", api_key="unused", timeout=1800)
    model = client.models.list().data[0].id
    messages = [{"role": "system", "content": doc["system"]}]
    rows = []
    for n, user in enumerate(doc["turns"], 1):
        messages.append({"role": "user", "content": user})
        start = time.perf_counter()
        first = None
        parts, usage, timings = [], None, {}
        stream = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0,
                                                stream=True, stream_options={"include_usage": True},
                                                extra_body=extra_body or None)
        for chunk in stream:
            extra = chunk.model_extra or {}
            if extra.get("timings"):
                timings = extra["timings"]
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                if choice.delta.content:
                    if first is None:
                        first = time.perf_counter()
                    parts.append(choice.delta.content)
        end = time.perf_counter()
        reply = "".join(parts)
        messages.append({"role": "assistant", "content": reply})
        details = getattr(usage, "prompt_tokens_details", None) if usage else None
        cached = getattr(details, "cached_tokens", None) if details else None
        if cached is None:
            cached = timings.get("cache_n")
        completion = usage.completion_tokens if usage else len(parts)
        ttft = (first or end) - start
        after_first = end - (first or end)
        row = {"turn": n, "prompt_tokens": usage.prompt_tokens if usage else None, "cached_tokens": cached,
               "ttft_s": ttft, "total_s": end - start, "completion_tokens": completion,
               "decode_tok_per_s": (completion - 1) / after_first if after_first > 0 and completion > 1 else None,
               "draft_n": timings.get("draft_n"), "draft_n_accepted": timings.get("draft_n_accepted"), "reply": reply}
        rows.append(row)
        rate = f"{row['decode_tok_per_s']:5.1f}" if row["decode_tok_per_s"] else "  -  "
        print(f"{label:<28} turn {n}: prompt {row['prompt_tokens']:>5} cached {str(cached):>5}  TTFT {ttft:6.2f} s"
              f"  {completion:3d} tokens at {rate} tok/s  total {row['total_s']:6.2f} s", flush=True)
    return rows


def run_server(command: list[str], url: str, env: dict, log_path: Path, doc: dict, max_tokens: int,
               extra_body: dict | None, label: str) -> list[dict]:
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            wait_ready(url, process)
            # One untimed request first: first-use costs (kernel loads, page faults) are not a turn's.
            converse(url, {"system": doc["system"], "turns": ["Say hi."]}, 4, extra_body, label + " (warm-up)")
            return converse(url, doc, max_tokens, extra_body, label)
        finally:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--llama-cpp", default=os.environ.get("LLAMA_CPP_BUILD"), help="llama.cpp build folder (with llama-server)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--tandem", nargs="+", default=["speculative", "plain"], choices=["speculative", "plain"],
                   help="Tandem's runs: speculative (its default drafter) and plain (speculative.enabled false)")
    p.add_argument("--peer-draft-max", type=int, nargs="+", default=[0],
                   help="llama-server runs: 0 plain, N with the drafter's GGUF and --draft-max N")
    p.add_argument("--no-repack", action="store_true", help="pass --no-repack to llama-server (AMX hosts)")
    p.add_argument("--conversation", type=Path, default=CONVERSATION)
    p.add_argument("--json", type=Path, default=Path("conversation-bench.json"))
    args = p.parse_args(argv)

    from engine.core.paths import cache_dir
    from engine.models.loading import default_pair

    doc = json.loads(args.conversation.read_text())
    gguf_dir = cache_dir() / "gguf"
    target, drafter = gguf_dir / default_pair.TARGET.filename, gguf_dir / default_pair.DRAFTER.filename
    from engine.bench.llamacpp import PEER_ENV

    # Both at the same thread count; llama.cpp's OpenMP threads wait passively, its best setting
    # on a shared machine (engine.bench.llamacpp.PEER_ENV), torch's at their default.
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    env.pop("OMP_WAIT_POLICY", None)
    peer_env = dict(env, **PEER_ENV)
    record = {"what": "a 4-turn coding conversation through the OpenAI API, one server at a time",
              "tandem_env": {"OMP_NUM_THREADS": env["OMP_NUM_THREADS"]}, "llamacpp_env": {"OMP_NUM_THREADS": env["OMP_NUM_THREADS"], **PEER_ENV},
              "conversation": doc["id"], "threads": args.threads, "max_tokens": args.max_tokens,
              "load_average_before": list(os.getloadavg()), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "runs": {}}
    tandem = [sys.executable, "-m", "engine.cli", "serve"]
    for mode in args.tandem:
        port = free_port()
        label = f"tandem serve ({mode})"
        extra = {"speculative": {"enabled": False}} if mode == "plain" else None
        record["runs"][label] = run_server(tandem + ["--port", str(port)], f"http://127.0.0.1:{port}", env,
                                           Path(f"/tmp/conversation-bench-tandem-{mode}.log"), doc, args.max_tokens,
                                           extra, label)
    if args.llama_cpp:
        server = Path(args.llama_cpp) / "bin" / "llama-server"
        for n in args.peer_draft_max:
            port = free_port()
            command = [str(server), "-m", str(target), "-t", str(args.threads), "-c", "8192", "--port", str(port),
                       "--host", "127.0.0.1", "-np", "1"]
            if n:
                command += ["-md", str(drafter), "-td", str(args.threads), "--spec-type", "draft-simple",
                            "--spec-draft-n-max", str(n)]
            if args.no_repack:
                command += ["--no-repack"]
            label = "llama-server " + (f"(draft {n})" if n else "(plain)")
            record["runs"][label] = run_server(command, f"http://127.0.0.1:{port}", peer_env, Path(f"/tmp/conversation-bench-llama-{n}.log"),
                                               doc, args.max_tokens, None, label)
    record["load_average_after"] = list(os.getloadavg())
    args.json.write_text(json.dumps(record, indent=1))
    print(f"\n{'server':<28}" + "".join(f"  turn {r['turn']} TTFT" for r in next(iter(record["runs"].values())))
          + "   all turns")
    for label, rows in record["runs"].items():
        print(f"{label:<28}" + "".join(f"  {r['ttft_s']:9.2f} s" for r in rows) + f"  {sum(r['total_s'] for r in rows):8.1f} s")
    print(f"load average before {record['load_average_before']}, after {record['load_average_after']}; {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
