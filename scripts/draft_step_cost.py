"""What one draft step costs beside one target step, measured side by side (interleaved, medians):
the default GGUF target's one-row pass against a drafter's one-token proposal after the same
context. Prints the ratio for each drafter given (a draft model folder or GGUF file, an EAGLE-3
or DFlash folder).

    python scripts/draft_step_cost.py --drafter PATH [--drafter PATH2] [--context 256] [--threads 2]
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=None, help="target (default: the offline pair's GGUF file)")
    parser.add_argument("--drafter", action="append", required=True,
                        help="a drafter (repeatable); 'default' is the offline pair's draft model")
    parser.add_argument("--context", type=int, default=256, help="tokens of context before the measured steps")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import torch

    from engine.cli.common import default_model_paths
    from engine.core.sampler import Sampler
    from engine.core.settings import DecodeSettings
    from engine.session.session import Session

    torch.set_num_threads(args.threads)
    target_path, default_drafter = default_model_paths(args.target, None, need_drafter=True, precision="file")
    greedy = Sampler(DecodeSettings())
    text = (Path(__file__).resolve().parents[1] / "engine" / "decode" / "decoding.py").read_text()
    for drafter_path in args.drafter:
        drafter_path = default_drafter if drafter_path == "default" else Path(drafter_path)
        session = Session.load(target_path, drafter_path, "file")
        drafter = session.model_drafter  # the model alone (no prompt lookup in front of it)
        tokens = session.tokenizer(text)["input_ids"]
        n = args.context
        runner = session.target_runner(drafter)
        drafter.reset()
        if drafter.attach_target is not None:
            drafter.attach_target(runner)
        runner.forward(tokens[: n - 1])
        drafter.prepare(tokens[:n])
        target_s, draft_s = [], []
        # As decoding runs: a one-token draft after the context, then the target's pass over
        # the context's last token; the text's next token is the next one chosen.
        for i in range(args.repeats + 3):
            context = tokens[:n]
            t0 = time.perf_counter()
            drafter.propose(context, 1, greedy)
            t1 = time.perf_counter()
            runner.forward([context[-1]])
            t2 = time.perf_counter()
            drafter.observe(n)
            n += 1
            if i >= 3:  # the first proposals read the prompt
                draft_s.append(t1 - t0)
                target_s.append(t2 - t1)
        t, d = statistics.median(target_s), statistics.median(draft_s)
        print(f"{Path(drafter_path).name}: target step {t * 1e3:.1f} ms, draft step {d * 1e3:.1f} ms, ratio {d / t:.3f}"
              f" (context {args.context}, {args.threads} threads)")


if __name__ == "__main__":
    main()
