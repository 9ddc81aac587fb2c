"""Measure what a real load and generation actually use, to check memory_fit's estimates.

Run it in a fresh process (``python -m engine.bench.memory_probe``) so the peak is that of Tandem
alone, not of a test runner: it loads a target (and optional draft model), feeds a prompt of
about ``context`` tokens, generates speculatively to the end of that context and prints JSON with
the resident set size at each stage and the peak. The peak is the kernel's own high-water mark
(``ru_maxrss``), which catches short spikes that a sampling thread would miss.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import psutil

from engine.core.settings import precision_name

_FILLER = (
    "def merge_sorted(a, b):\n"
    "    out, i, j = [], 0, 0\n"
    "    while i < len(a) and j < len(b):\n"
    "        if a[i] <= b[j]:\n"
    "            out.append(a[i]); i += 1\n"
    "        else:\n"
    "            out.append(b[j]); j += 1\n"
    "    return out + a[i:] + b[j:]\n\n"
)


class RssSampler:
    """Samples resident memory in a thread, split into file-backed pages (memory-mapped weights)
    and anonymous memory (runtime, activations, KV cache), whose peaks ru_maxrss cannot separate."""

    def __init__(self, interval_s: float = 0.01) -> None:
        import threading

        self._proc = psutil.Process()
        self._interval = interval_s
        self._stop = threading.Event()
        self.peak_rss = self.peak_anon = self.peak_file = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> tuple[int, int]:
        info = self._proc.memory_info()
        shared = getattr(info, "shared", 0)  # Linux: file-backed + shmem resident pages
        return info.rss - shared, shared

    def _run(self) -> None:
        while not self._stop.is_set():
            anon, shared = self.sample()
            self.peak_rss = max(self.peak_rss, anon + shared)
            self.peak_anon = max(self.peak_anon, anon)
            self.peak_file = max(self.peak_file, shared)
            self._stop.wait(self._interval)

    def __enter__(self) -> "RssSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def mapped_files(min_bytes: int = 1 << 20) -> dict[str, int]:
    """Resident bytes of each memory-mapped file (Linux /proc/self/smaps; {} elsewhere), by file
    name: tells weights read every step (the int8 cache) from checkpoint pages read once while
    converting, which the OS may drop."""
    found: dict[str, int] = {}
    current = None
    try:
        lines = Path("/proc/self/smaps").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5 and not line.startswith(("Rss", "Size")):
            current = Path(head[5]).name if len(head) >= 6 and head[5].startswith("/") else None
        elif head and head[0] == "Rss:" and current:
            found[current] = found.get(current, 0) + int(head[1]) * 1024
    return {name: size for name, size in found.items() if size >= min_bytes}


def peak_rss_bytes() -> int:
    """This process's peak resident set size so far. On Linux the mm's own high-water mark
    (VmHWM), which starts afresh at exec: ru_maxrss carries over the peak of the process that
    forked this one (a test runner's 2 GiB, say). Elsewhere ru_maxrss (macOS reports bytes)."""
    import resource  # POSIX only, like this probe

    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def long_prompt_ids(session, tokens: int) -> list[int]:
    """Chat-formatted prompt ids of exactly ``tokens`` tokens: repeated code, then a question."""
    text = _FILLER * (tokens // 60 + 2)
    ids = session.tokenizer(text)["input_ids"]
    tail = session.encode("Continue the file above with a function that merges k sorted lists.")
    return ids[: max(1, tokens - len(tail))] + tail


def measure(target: Path, drafter: Path | None, precision: str, context: int, new_tokens: int, device: str = "cpu") -> dict:
    from engine.core.settings import DecodeSettings
    from engine.session.compare import drain
    from engine.session.session import Session

    proc = psutil.Process()
    report: dict = {"context": context, "new_tokens": new_tokens, "precision": precision, "device": device}
    import torch  # noqa: F401  (the runtime baseline: torch + transformers imported, nothing loaded)
    import transformers  # noqa: F401

    sampler = RssSampler()
    report["anon_runtime"], _ = sampler.sample()
    report["rss_runtime"] = proc.memory_info().rss
    start = time.perf_counter()
    with sampler:
        session = Session.load(target, drafter, precision, device)
    report["load_s"] = round(time.perf_counter() - start, 1)
    report["rss_loaded"] = proc.memory_info().rss
    report["anon_loaded"], report["file_loaded"] = sampler.sample()
    report["peak_after_load"] = peak_rss_bytes()
    report["load_peak_anon"] = sampler.peak_anon
    prompt = long_prompt_ids(session, context - new_tokens)
    settings = DecodeSettings(max_new_tokens=new_tokens)
    start = time.perf_counter()
    with RssSampler() as gen_sampler:
        events = session.speculative(prompt, settings, "model" if drafter else "off")
        result = drain(events)
    report["generate_s"] = round(time.perf_counter() - start, 1)
    report["generate_peak_anon"] = gen_sampler.peak_anon
    report["generate_peak_file"] = gen_sampler.peak_file
    report["anon_end"], report["file_end"] = sampler.sample()
    report["mapped_end"] = mapped_files()
    report["prompt_tokens"] = len(prompt)
    report["generated_tokens"] = result.stats.new_tokens
    report["rss_end"] = proc.memory_info().rss
    report["peak_rss"] = peak_rss_bytes()
    # Resident file pages per model folder: an int8 drafter's bf16 file was read once while
    # quantizing, and those clean pages stay counted in the RSS until the OS reclaims them.
    report["target_file_end"] = mapped_bytes_under(proc, target)
    report["drafter_file_end"] = mapped_bytes_under(proc, drafter) if drafter else 0
    report["drafter_weights"] = session.drafter_model.weights if session.drafter_model else None
    # An int4 drafter's layers are read from its weight cache, memory-mapped, at every step (they
    # must stay resident); an int8 drafter's are packed into a copy, and the file was read once.
    report["drafter_cache_end"] = drafter_cache_bytes(proc, drafter, report["drafter_weights"])
    # A first load at an int8 / int4 precision quantizes and writes the weight cache: it reads
    # the whole checkpoint and leaves the allocator holding what the conversion freed. Every
    # later start maps the cache instead; measure_steady measures one of those.
    report["wrote_weight_cache"] = any(quantized_now(m) for m in (session.target, session.drafter_model))
    return report


def quantized_now(loaded) -> bool:
    """Whether this load quantized int8 / int4 layers itself (not taken from the weight cache)."""
    return loaded is not None and getattr(loaded, "weights", "") in ("int8", "int4") and not loaded.from_cache


def measure_steady(args: list[str], env: dict | None = None, timeout_s: float = 600) -> dict:
    """The probe's report in a fresh process, as a start after the first sees it: when the first
    run had to write a weight cache, a second run measures the start that maps it. Deterministic
    whatever state the caches are in, which a measured test needs."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    for _ in range(2):
        out = subprocess.run([sys.executable, "-m", "engine.bench.memory_probe", *args], cwd=root,
                             capture_output=True, text=True, timeout=timeout_s, env=env)
        if out.returncode != 0:
            raise RuntimeError(f"memory probe failed ({out.returncode}): {out.stderr[-2000:]}")
        report = json.loads(out.stdout.strip().splitlines()[-1])
        if not report["wrote_weight_cache"]:
            return report
    raise RuntimeError("the memory probe wrote a weight cache twice: the cache is not being kept")


def drafter_cache_bytes(proc, drafter: Path | None, weights: str | None) -> int:
    """Resident bytes of a draft model's int8 / int4 weight cache (engine.quant.weight_cache): a
    converted folder's, or a GGUF drafter's re-quantized layers (engine.models.loading.gguf_drafter)."""
    from engine.quant import weight_cache

    if drafter is None or weights not in weight_cache.KINDS:
        return 0
    path = weight_cache.cache_path(Path(drafter), weights, "drafter")
    return mapped_bytes_under(proc, path) if path.exists() else 0


def mapped_bytes_under(proc, folder: Path) -> int:
    """Resident bytes of the memory-mapped files inside ``folder``, or of ``folder`` itself when
    it is a file (a .gguf model); 0 where the OS can't say."""
    root = str(Path(folder).resolve())
    inside = (lambda path: path == root) if Path(folder).is_file() else (lambda path: path.startswith(root + "/"))
    try:
        maps = proc.memory_maps(grouped=True)
    except (psutil.AccessDenied, NotImplementedError, AttributeError):
        return 0
    return sum(m.rss for m in maps if inside(str(Path(m.path).resolve())))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", help="model folder or .gguf file (default: the offline default pair's target)")
    parser.add_argument("--drafter", help="draft model folder (default: the default pair's drafter)")
    parser.add_argument("--no-drafter", action="store_true")
    parser.add_argument("--precision", type=precision_name, choices=("bf16", "fp32", "int8", "file"),
                        help="file: a .gguf --target (and --drafter) computing on its own quantized weights", default="bf16")
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    if args.target:
        target, drafter = Path(args.target), Path(args.drafter) if args.drafter else None
    else:
        from engine.models.loading import default_pair

        found = default_pair.installed_paths()
        if found is None:
            print("default model pair not installed: run `tandem setup` first", file=sys.stderr)
            return 1
        target, drafter = found
    if args.no_drafter:
        drafter = None
    report = measure(target, drafter, args.precision, args.context, args.new_tokens, args.device)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
