"""Tandem's engine: everything that computes. Never imports Qt."""
import os

# OpenMP threads wait between parallel regions by spinning a while, then sleeping. libgomp cuts
# that spin to ~nothing once it manages more threads than there are CPUs, which happens as soon as
# a second thread (the app's worker, a server's engine thread) has used torch's pool: its idle
# thread then sleeps after every kernel call of a decode step, a few hundred a step, and the
# default target's one-token step takes 25-30 ms instead of 20 (2 threads, quiet machine). This
# count is libgomp's own default, a few ms at most, so an idle app does not keep a core busy; it
# does not reach the throttled case (measured: with it set, a step on a second thread still took
# 50-56 ms against 40-43 on the loading thread), which is why a thread that stops computing
# releases its pool (engine/core/openmp_pool.py). Set before torch loads libgomp; the user's wins.
os.environ.setdefault("GOMP_SPINCOUNT", "300000")
