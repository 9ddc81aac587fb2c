"""``--remote URL`` for ``tandem compare`` and ``tandem models``: the same questions asked of
remote OpenAI-compatible engines (vLLM, llama.cpp's server, another ``tandem serve``).

    tandem compare --remote http://gpu-a:8000 --remote http://gpu-b:8000 "prompt"
        races the two endpoints on the prompt (greedy), each one's speed from its own stream,
        acceptance from what the server reports, and whether the outputs are identical
    tandem compare --remote http://box:8080 "prompt"
        one endpoint: the prompt with its speculation, then with ``speculative.enabled: false``
        (a field ``tandem serve`` reads; other servers ignore it, so both runs speculate there)
    tandem models --remote URL      the endpoint's /v1/models

The options are added to the existing subcommands here, so their own modules stay as they are.
"""
from __future__ import annotations

import os


def add_remote_options(sub) -> None:
    """Give ``compare`` and ``models`` the --remote options; a remote run replaces the local one."""
    for name, remote_run in (("compare", run_remote_compare), ("models", run_remote_models)):
        parser = sub.choices[name]
        parser.add_argument("--remote", action="append", metavar="URL", default=None,
                            help="an OpenAI-compatible server (repeat for two: they are raced)")
        parser.add_argument("--remote-key", action="append", metavar="KEY", default=None,
                            help="its API key (one for all, or one per --remote; default: $TANDEM_REMOTE_KEY)")
        if name == "compare":
            parser.add_argument("--remote-model", metavar="ID", default=None,
                                help="the model to ask for (default: each server's first in /v1/models)")
            parser.add_argument("--sequential", action="store_true",
                                help="two endpoints one after the other, not at once (they share a machine)")
        local_run = parser.get_default("func")
        parser.set_defaults(func=lambda args, local=local_run, remote=remote_run: remote(args) if args.remote
                            else local(args))


def _endpoints(args):
    from engine.remote.client import RemoteEndpoint

    urls = args.remote
    keys = args.remote_key or [os.environ.get("TANDEM_REMOTE_KEY") or None]
    if len(urls) > 2:
        raise ValueError("--remote: one endpoint, or two to race")
    if len(keys) not in (1, len(urls)):
        raise ValueError("--remote-key: one for every endpoint, or one per --remote")
    keys = keys * len(urls) if len(keys) == 1 else keys
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"--remote {url!r}: give an http:// or https:// URL")
    return [RemoteEndpoint(url, key) for url, key in zip(urls, keys)]


def run_remote_models(args) -> int:
    from engine.remote.client import RemoteClient
    from engine.remote.text import printable

    for endpoint in _endpoints(args):
        with RemoteClient(endpoint) as client:
            models = client.list_models()
        print(f"{printable(endpoint.api_base, one_line=True)}:")
        for m in models:
            window = f"  context {m.max_model_len}" if m.max_model_len else ""
            print(f"   {printable(m.id, one_line=True)}{window}  (remote, on the server)")
    return 0


def run_remote_compare(args) -> int:
    from engine.remote.client import RemoteClient
    from engine.remote.race import Lane, LaneDone, RaceResult, race
    from engine.remote.text import printable

    if not args.prompt.strip():
        raise ValueError("the prompt is empty")
    endpoints = _endpoints(args)
    clients = [RemoteClient(e) for e in endpoints]
    try:
        models = [args.remote_model or c.list_models()[0].id for c in clients]
        if len(clients) == 2:
            lanes = [Lane(e.url, c, m) for e, c, m in zip(endpoints, clients, models)]
        else:
            lanes = [Lane(f"{endpoints[0].url} (its speculation)", clients[0], models[0]),
                     Lane(f"{endpoints[0].url} (speculative.enabled false)", clients[0], models[0],
                          (("speculative", {"enabled": False}),))]
        fields = {"max_tokens": args.max_new_tokens, "temperature": 0 if args.mode == "greedy" else args.temperature,
                  "top_p": args.top_p, "seed": args.seed}
        messages = [{"role": "user", "content": args.prompt}]
        if len(lanes) == 2 and not (args.sequential or len(clients) == 1):
            runs = next(e for e in race(lanes, messages, **fields) if isinstance(e, RaceResult)).runs
        else:  # one after the other: one endpoint cannot race itself fairly
            runs = tuple(next(e.run for e in race([lane], messages, **fields) if isinstance(e, LaneDone))
                         for lane in lanes)
    finally:
        for c in clients:
            c.close()
    result = RaceResult(runs)
    # What the servers sent is shown, not obeyed: their terminal controls print as escapes.
    for run in runs:
        name = printable(run.name, one_line=True)
        print(f"=== {name} ===\n" + (printable(run.text) if run.error is None
                                      else f"error: {printable(run.error, one_line=True)}"))
    print()
    for run in runs:
        first = f"{run.first_token_s:.3f}s" if run.first_token_s is not None else "-"
        print(f"{printable(run.name, one_line=True)}\n   {run.new_tokens} tokens, {run.tok_per_s:.2f} tok/s after the first, "
              f"first token {first}; {run.acceptance.describe()}")
    if result.speedup:
        print(f"speed ratio (first / second): {result.speedup:.2f}x")
    if args.mode == "greedy":
        print("outputs: identical" if result.identical else "outputs: differ")
    return 1 if any(r.error for r in runs) else 0
