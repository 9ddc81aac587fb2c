"""Time drawing a sampled token: the draw Tandem uses (kernels.sampling.sample_from) against
torch.multinomial, alone over the default target's vocabulary and inside plain sampled decoding
of the default GGUF target, alternated in one process so that both see the same machine load.

    python scripts/sampling_bench.py [--threads 2 --cached 256 4096 --tokens 32 --repeats 6]
    python scripts/sampling_bench.py --draw-only

Prints the median ms per draw, then per decoded token (target pass, T=0.7 processing and the
draw) at each cache length, and the ratio.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.core import sampler as sampler_module  # noqa: E402
from engine.core.settings import DecodeSettings  # noqa: E402
from kernels.sampling import process_logits, sample_from  # noqa: E402

VOCAB = 151_936


def multinomial(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """What sample_from replaced."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).squeeze(-1).reshape(probs.shape[:-1])


DRAWS = {"torch.multinomial": multinomial, "sample_from": sample_from}


def time_draws(repeats: int) -> None:
    gen = torch.Generator().manual_seed(0)
    probs = process_logits(torch.randn(VOCAB, generator=gen) * 3, temperature=0.7)
    for name, draw in DRAWS.items():
        draw(probs, gen)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(20):
                draw(probs, gen)
            times.append((time.perf_counter() - start) / 20 * 1000)
        print(f"one draw over {VOCAB} tokens: {name} {statistics.median(times):.3f} ms")


def time_decoding(cached_lengths: list[int], tokens: int, repeats: int) -> None:
    from engine.cli.common import default_model_paths
    from engine.decode.decoding import decode_one_token
    from engine.models.loading.loader import load_model
    from engine.models.runners.gguf_runner import GgufRunner

    target, _ = default_model_paths(None, None, need_drafter=False, precision="file")  # the default pair's GGUF target
    runner = GgufRunner(load_model(target, "file", "cpu", check_memory=False).model)
    rng = torch.Generator().manual_seed(0)
    for cached in cached_lengths:
        prompt = torch.randint(100, 20000, (cached,), generator=rng).tolist()
        runner.reset()
        for start in range(0, cached, 512):
            runner.forward(prompt[start:start + 512])
        times: dict[str, list[float]] = {name: [] for name in DRAWS}
        for rep in range(repeats):
            order = list(DRAWS) if rep % 2 == 0 else list(reversed(DRAWS))
            for name in order:
                sampler_module.sample_from = DRAWS[name]
                sampler = sampler_module.Sampler(DecodeSettings(mode="sample", temperature=0.7, seed=rep))
                runner.crop(cached)
                token = prompt[-1]
                start = time.perf_counter()
                for _ in range(tokens):
                    token = decode_one_token(runner, [token], sampler)
                times[name].append((time.perf_counter() - start) / tokens * 1000)
        medians = {name: statistics.median(t) for name, t in times.items()}
        for name, t in times.items():
            print(f"{cached} cached tokens: {name} {medians[name]:.2f} ms a token (runs {', '.join(f'{x:.1f}' for x in t)})")
        print(f"{cached} cached tokens: plain sampled decoding {medians['torch.multinomial'] / medians['sample_from']:.3f}x "
              "with sample_from")
    sampler_module.sample_from = sample_from


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cached", type=int, nargs="+", default=[256, 4096])
    parser.add_argument("--tokens", type=int, default=32, help="tokens decoded per timed run")
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--draw-only", action="store_true", help="time the draws alone, not decoding")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    time_draws(args.repeats)
    if not args.draw_only:
        time_decoding(args.cached, args.tokens, args.repeats)


if __name__ == "__main__":
    main()
