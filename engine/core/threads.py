"""How many CPU threads a decode step should use while other programs share the cores.

A step is a few hundred kernel calls, each split over torch's threads with a barrier at its end.
When another program keeps a core busy, the scheduler shares that core between it and one of
our threads: the other thread waits at every barrier for the one that was descheduled. Measured
on 2 cores, default pair, plain greedy decoding (tok/s, 2 threads against 1):

    quiet machine        2 threads 13.5-15.4   1 thread 8.0-8.7
    one busy thread      2 threads 4.2-4.7     1 thread 8.6-8.7
    two busy threads     2 threads 0.9-3.8     1 thread 5.2-5.7

So the thread count follows the cores other programs leave free. ``ThreadPolicy.adjust`` is
called between steps (cheap: it samples at most every ``interval_s``); it reads the machine's
busy CPU time and this process's own (psutil), takes what others used over the last interval
in cores, and sets ``torch.set_num_threads`` to the cores left, rounded so that a program using
less than ``SHARE_TOLERATED`` of a core does not cost us a thread, between 1 and the most the
user allows. The kernels' results do not depend on the thread count (they split output columns
and fixed key blocks, never a reduction), so the output is the same whatever it picks.

torch's thread count is per calling thread under OpenMP: ``adjust`` must run on the thread that
runs the steps (the session calls it between the events of a request).
"""
from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import replace

import psutil
import torch

from engine.core.events import Finished, Stats
from engine.core.openmp_pool import release_openmp_workers

log = logging.getLogger(__name__)

#: A share of a core that other programs may use before we give up a thread for them: a
#: browser tab's or an editor's background work is not worth halving our compute for.
SHARE_TOLERATED = 0.35
#: Seconds between two samples of the machine's CPU time; a shorter window is mostly noise.
INTERVAL_S = 0.3


def threads_for(cpus: int, others_cores: float, max_threads: int) -> int:
    """Threads to run when other programs keep ``others_cores`` of ``cpus`` cores busy."""
    free = cpus - max(0.0, others_cores)
    return max(1, min(max_threads, math.floor(free + SHARE_TOLERATED)))


def _busy_seconds(times, count_niced: bool) -> float:
    """CPU seconds the machine spent on work that competes with ours: steal included (a core the
    hypervisor gave to another guest is not ours either); niced programs' time only when we are
    niced too, as the scheduler gives an un-niced process nearly all of a core that a niced one
    shares (a compile at nice 19 beside us took ~2% of our steps' time)."""
    idle = times.idle + getattr(times, "iowait", 0.0)
    busy = sum(times) - idle - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    return busy if count_niced else busy - getattr(times, "nice", 0.0)


class ThreadPolicy:
    """Follows the free cores (``adaptive``) or keeps ``max_threads`` (``fixed``)."""

    def __init__(self, max_threads: int | None = None, adaptive: bool = True, interval_s: float = INTERVAL_S) -> None:
        self.max_threads = max(1, max_threads or torch.get_num_threads())
        self.adaptive = adaptive
        self.interval_s = interval_s
        self.cpus = psutil.cpu_count(logical=True) or os.cpu_count() or 1
        self._process = psutil.Process()
        self._niced = self._process.nice() > 0  # our own time is counted as "nice" then
        self._last: tuple[float, float, float] | None = None  # wall, machine busy, our own CPU s
        self.others_cores: float | None = None
        self.threads = self.max_threads
        #: The thread counts the last request ran with, in order (for reports).
        self.used: list[int] = []

    @property
    def policy(self) -> str:
        return "adaptive" if self.adaptive else "fixed"

    def _sample(self) -> tuple[float, float, float]:
        own = self._process.cpu_times()
        return time.monotonic(), _busy_seconds(psutil.cpu_times(), self._niced), own.user + own.system

    def adjust(self) -> int:
        """Sample when the interval has passed and set torch's threads for the next steps; returns
        the thread count in force. Call it on the thread that runs the steps."""
        if not self.adaptive:
            self._apply(self.max_threads)
            return self.threads
        now = time.monotonic()
        if self._last is not None and now - self._last[0] < self.interval_s:
            return self.threads
        sample = self._sample()
        if self._last is not None:
            wall = sample[0] - self._last[0]
            others = ((sample[1] - self._last[1]) - (sample[2] - self._last[2])) / wall
            # Counters tick in 10 ms units: a short window can read a little below zero.
            self.others_cores = min(float(self.cpus), max(0.0, others))
            self._apply(threads_for(self.cpus, self.others_cores, self.max_threads))
        else:
            self._apply(self.threads)
        self._last = sample
        return self.threads

    def paced(self, events):
        """``events`` (a request's generator) with the thread count adjusted before each step;
        torch's count is put back when the request ends, so nothing else inherits it. The
        first step's choice comes from the time since the last request (a sample over it)."""
        before = torch.get_num_threads()
        self.used = []
        try:
            while True:
                threads = self.adjust()
                if not self.used or self.used[-1] != threads:
                    self.used.append(threads)
                try:
                    event = next(events)
                except StopIteration:
                    return
                if isinstance(event, (Stats, Finished)):
                    event = replace(event, stats=replace(event.stats, threads_fewest=min(self.used),
                                                         threads_max=self.max_threads))
                yield event
        finally:
            events.close()
            torch.set_num_threads(before)
            # The next request may run on another thread (the server's, after the app's):
            # this one's OpenMP workers must not outlive its work (engine.core.openmp_pool).
            release_openmp_workers()

    def _apply(self, threads: int) -> None:
        if threads != self.threads:
            log.info("threads %d -> %d (other programs using %.2f cores)", self.threads, threads,
                     self.others_cores or 0.0)
        self.threads = threads
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)

    def describe_last(self) -> str:
        """What the last request ran with, for a report line."""
        if not self.adaptive:
            return f"{self.max_threads} threads (fixed)"
        counts = " then ".join(str(n) for n in self.used) or str(self.threads)
        return f"{counts} of {self.max_threads} threads (adaptive to other programs' load)"
