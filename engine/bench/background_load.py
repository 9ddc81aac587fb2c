"""A bounded background load for benchmarks: busy CPU threads and held memory, in child processes.

Tandem's speedups were first measured on an idle machine; a user's machine runs a browser beside
it. ``BackgroundLoad`` starts, for the length of a ``with`` block:

- ``threads`` busy threads in one child process, each spinning on real work (a small numpy matmul
  with BLAS held to one thread, so each thread is one busy core; a pure-Python loop where numpy
  is missing). They are pinned to nothing: the scheduler shares the cores with the timed runs.
- a child holding ``memory_gb`` GB of RAM, every page written once, so the page cache (the
  memory-mapped weights of a GGUF target among it) has that much less room. Or, with
  ``memory_left_gb``, a child sized when the load starts to take all the memory the system
  reports available but that much: a fixed size is harmless on a machine with RAM to spare and
  the OOM killer's on a small one, where leaving a few hundred MB makes the kernel drop pages
  of the running model's file, which must then be read back from disk as it computes.

Both children are stopped when the block ends, however it ends (an exception, Ctrl-C): SIGTERM,
then SIGKILL after a timeout. They also end themselves when the parent dies without stopping them
(even by SIGKILL): each reads its stdin, a pipe from the parent, and exits at its end of file.
They ignore SIGINT, so a Ctrl-C in the terminal stops the parent's run and the parent stops them.

Run as ``python -m engine.bench.background_load cpu N`` or ``... memory GB`` (what the parent does).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

# BLAS, OpenMP and torch's pools held to one thread in the CPU child: N threads mean N cores.
_ONE_THREAD = {k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")}
_READY = "ready"
PAGE = 4096


class BackgroundLoadError(RuntimeError):
    """A load child that did not start (or died before it was ready)."""


def _exit_at_parent_eof() -> None:
    """In a child: a daemon thread that ends the process when its stdin (the parent's pipe) closes."""
    def watch() -> None:
        try:
            while sys.stdin.buffer.read(4096):
                pass
        except (OSError, ValueError):
            pass
        os._exit(0)

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


def _spin_numpy(stop: threading.Event) -> None:
    import numpy as np

    a = np.random.default_rng(0).standard_normal((128, 128))
    b = a.T.copy()
    while not stop.is_set():
        for _ in range(50):
            a = np.tanh(a @ b * 0.01)  # stays finite; numpy releases the GIL in the matmul


def _spin_python(stop: threading.Event) -> None:
    x = 0
    while not stop.is_set():
        for i in range(10000):
            x = (x * 31 + i) % 1000003


def cpu_child(threads: int) -> None:
    """``threads`` threads spinning until the process is stopped."""
    try:
        import numpy  # noqa: F401
        spin = _spin_numpy
    except ImportError:  # pragma: no cover
        spin = _spin_python
    stop = threading.Event()
    workers = [threading.Thread(target=spin, args=(stop,), daemon=True, name=f"busy-{i}") for i in range(threads)]
    for w in workers:
        w.start()
    print(f"{_READY} cpu {threads} {spin.__name__.removeprefix('_spin_')}", flush=True)
    while True:
        time.sleep(3600)


def memory_child(gb: float) -> None:
    """``gb`` GB allocated and every page written (so it is resident), held until stopped."""
    size = int(gb * 1e9)
    block = bytearray(size)  # calloc'd: zero pages are not resident until written
    for i in range(0, size, PAGE):
        block[i] = 1
    print(f"{_READY} memory {size}", flush=True)
    while True:
        time.sleep(3600)
        block[0] = 1  # keeps it referenced (and touched now and then)


def _child_main(argv: list[str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us; a terminal's Ctrl-C is its
    _exit_at_parent_eof()
    kind, amount = argv
    if kind == "cpu":
        cpu_child(int(amount))
    elif kind == "memory":
        memory_child(float(amount))
    else:
        raise SystemExit(f"unknown load {kind!r}")


class BackgroundLoad:
    """``with BackgroundLoad(threads=2, memory_gb=4) as load:`` the load runs inside the block.
    ``describe()`` says what ran (and the CPU time the busy threads have used so far)."""

    def __init__(self, threads: int = 0, memory_gb: float = 0.0, ready_timeout: float = 120.0, stop_timeout: float = 5.0,
                 memory_left_gb: float | None = None):
        if threads < 0:
            raise ValueError(f"background threads must be >= 0, not {threads}")
        if memory_gb < 0:
            raise ValueError(f"memory pressure must be >= 0 GB, not {memory_gb}")
        if memory_left_gb is not None:
            if memory_gb:
                raise ValueError("give the memory to hold (memory_gb) or the memory to leave (memory_left_gb), not both")
            if not memory_left_gb >= 0:
                raise ValueError(f"the memory to leave must be >= 0 GB, not {memory_left_gb}")
        self.threads, self.memory_gb, self.memory_left_gb = threads, memory_gb, memory_left_gb
        self.available_at_start_gb: float | None = None
        self.ready_timeout, self.stop_timeout = ready_timeout, stop_timeout
        self.cpu: subprocess.Popen | None = None
        self.memory: subprocess.Popen | None = None
        self._started_at: float | None = None
        self._stopped: dict | None = None
        self._cpu_at_start = 0.0

    @property
    def active(self) -> bool:
        return bool(self.threads or self.memory_gb or self.memory_left_gb is not None)

    @property
    def children(self) -> list[subprocess.Popen]:
        return [p for p in (self.cpu, self.memory) if p is not None]

    def _spawn(self, kind: str, amount) -> subprocess.Popen:
        env = {**os.environ, **(_ONE_THREAD if kind == "cpu" else {})}
        root = str(Path(__file__).resolve().parents[2])  # the folder holding the engine package
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        proc = subprocess.Popen([sys.executable, "-m", "engine.bench.background_load", kind, str(amount)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
        return proc

    def _wait_ready(self, proc: subprocess.Popen, kind: str) -> str:
        found: list[str] = []
        reader = threading.Thread(target=lambda: found.append(proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(self.ready_timeout)
        line = found[0].strip() if found else ""
        if not line.startswith(_READY):
            code = proc.poll()
            raise BackgroundLoadError(f"the {kind} load child did not start"
                                      + (f" (exit status {code})" if code is not None else f" within {self.ready_timeout:.0f} s"))
        return line

    def start(self) -> "BackgroundLoad":
        try:
            if self.memory_left_gb is not None:
                import psutil

                self.available_at_start_gb = psutil.virtual_memory().available / 1e9
                self.memory_gb = round(max(0.0, self.available_at_start_gb - self.memory_left_gb), 3)
            if self.memory_gb:  # first: the memory is held before the busy threads compete with it
                self.memory = self._spawn("memory", self.memory_gb)
                self._wait_ready(self.memory, "memory")
            if self.threads:
                self.cpu = self._spawn("cpu", self.threads)
                self._wait_ready(self.cpu, "cpu")
        except BaseException:
            self.stop()
            raise
        self._started_at = time.perf_counter()
        self._cpu_at_start = self._cpu_seconds() or 0.0  # the child's start-up (imports) is not load
        return self

    def _cpu_seconds(self) -> float | None:
        import psutil

        if self.cpu is None or self.cpu.poll() is not None:
            return None
        try:
            t = psutil.Process(self.cpu.pid).cpu_times()
        except psutil.Error:
            return None
        return t.user + t.system

    def _memory_rss(self) -> int | None:
        import psutil

        if self.memory is None or self.memory.poll() is not None:
            return None
        try:
            return psutil.Process(self.memory.pid).memory_info().rss
        except psutil.Error:
            return None

    def describe(self) -> dict:
        """For a report: what was asked, and what the children did (CPU cores kept busy on
        average so far, the memory child's resident size)."""
        if self._stopped is not None:
            return self._stopped
        wall = time.perf_counter() - self._started_at if self._started_at is not None else None
        cpu = self._cpu_seconds()
        cpu = cpu - self._cpu_at_start if cpu is not None else None
        rss = self._memory_rss()
        return {"threads": self.threads, "memory_gb": self.memory_gb,
                "memory_left_gb": self.memory_left_gb, "available_at_start_gb": self.available_at_start_gb,
                "busy_cpu_seconds": cpu, "wall_seconds": wall,
                "busy_cores": cpu / wall if cpu is not None and wall else None,
                "memory_rss_gb": rss / 1e9 if rss is not None else None, "ended_early": self._ended_early()}

    def _ended_early(self) -> dict[str, int]:
        """Children that exited before the load was stopped, with their exit status: a run measured
        after that was not under the load asked for (a memory child near the limit may meet the
        out-of-memory killer, status -9)."""
        return {kind: proc.returncode for kind, proc in (("cpu", self.cpu), ("memory", self.memory))
                if proc is not None and proc.poll() is not None}

    def text(self) -> str:
        """What runs, for a person: busy threads and the memory held (and how it was sized)."""
        parts = [f"{self.threads} busy thread{'s' if self.threads != 1 else ''}"] if self.threads else []
        if self.memory_left_gb is not None:
            held = f"{self.memory_gb:g} GB held" if self.available_at_start_gb is not None else "memory held"
            parts.append(f"{held} (all but {self.memory_left_gb:g} GB of what was available)")
        elif self.memory_gb:
            parts.append(f"{self.memory_gb:g} GB held")
        ended = self._stopped["ended_early"] if self._stopped is not None else self._ended_early()
        for kind, status in ended.items():
            killed = " (killed: the system's out-of-memory killer, most likely)" if status == -9 and kind == "memory" else ""
            parts.append(f"WARNING: the {kind} child ended early with status {status}{killed}, so later runs were not under this load")
        return ", ".join(parts) or "none"

    def stop(self) -> None:
        """Stops both children (SIGTERM, SIGKILL after ``stop_timeout``) and reaps them; safe to
        call more than once."""
        if self._stopped is None and self._started_at is not None:
            self._stopped = self.describe()
        for proc in self.children:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.children:
            try:
                proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    try:
                        stream.close()
                    except OSError:
                        pass

    def __enter__(self) -> "BackgroundLoad":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def add_load_options(parser, during: str) -> None:
    """The flags of a command that times runs beside a load: ``--background-load``,
    ``--memory-pressure``, ``--memory-left``; ``during`` says when the load runs ("during the
    timed runs")."""
    parser.add_argument("--background-load", type=int, default=0, metavar="N",
                        help=f"N busy threads in a child process {during} (a busy machine; default 0)")
    parser.add_argument("--memory-pressure", type=float, default=0.0, metavar="GB",
                        help=f"a child process holding this much RAM {during} (less page cache; default 0)")
    parser.add_argument("--memory-left", type=float, default=None, metavar="GB",
                        help=f"a child process taking all the RAM available but this much {during}: with a few hundred"
                             " MB left the system drops pages of the model's file, read back from disk as it runs")


def load_from_args(args) -> BackgroundLoad:
    """The load those flags ask for; ValueError, naming the flag, for a value that cannot be."""
    if args.background_load < 0:
        raise ValueError(f"--background-load must be >= 0 busy threads, not {args.background_load}")
    if not args.memory_pressure >= 0:
        raise ValueError(f"--memory-pressure must be >= 0 GB, not {args.memory_pressure}")
    if args.memory_left is not None and (args.memory_pressure or not args.memory_left >= 0):
        raise ValueError("--memory-left takes a size >= 0 GB, and not beside --memory-pressure (hold this much, or leave"
                         " this much)")
    return BackgroundLoad(threads=args.background_load, memory_gb=args.memory_pressure, memory_left_gb=args.memory_left)



if __name__ == "__main__":
    _child_main(sys.argv[1:])

