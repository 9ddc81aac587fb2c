"""A thread that stops computing lets go of its OpenMP workers, so that the pools of the threads
that load models and run requests never together outnumber the cores (libgomp then sleeps at
every barrier of every kernel call)."""
import os
import threading

import pytest
import torch

from engine.core.openmp_pool import release_openmp_workers, releases_openmp_workers
from engine.core.threads import ThreadPolicy

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through /proc")


def _os_threads() -> set[str]:
    """The process's native thread ids (other tests' threads may come and go meanwhile: the
    tests follow the ids the work started)."""
    return set(os.listdir("/proc/self/task"))


def _gone(tids: set[str]) -> bool:
    """Whether the threads ``tids`` have ended. Released workers exit just after the release
    returns, so look again a bounded number of times (no clock involved)."""
    for _ in range(100_000):
        if not tids & _os_threads():
            return True
        os.sched_yield()
    return False


def _parallel_work() -> torch.Tensor:
    # Large enough for at::parallel_for to split it over two threads.
    return torch.arange(1 << 22, dtype=torch.float32).exp_().sum()


def _on_a_new_thread(body):
    """Run ``body`` on a fresh thread (its own OpenMP pool, none yet), returning its result."""
    out = {}

    def run():
        torch.set_num_threads(2)
        out["result"] = body()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return out["result"]


@pytest.fixture(autouse=True)
def _gnu_openmp():
    _parallel_work()  # torch's OpenMP runtime is loaded by now
    if not releases_openmp_workers():
        pytest.skip("this torch does not compute through GNU OpenMP")


def test_released_workers_end_and_computing_again_starts_new_ones():
    def body():
        before = _os_threads()
        first = _parallel_work()
        workers = _os_threads() - before
        released = release_openmp_workers()
        gone = _gone(workers)
        before_again = _os_threads()
        again = _parallel_work()  # the runtime starts a pool again
        return workers, released, gone, _os_threads() - before_again, first, again

    workers, released, gone, new_workers, first, again = _on_a_new_thread(body)
    assert len(workers) == 1  # two threads computed: this one and one OpenMP worker
    assert released and gone
    assert len(new_workers) == 1 and torch.equal(first, again)


def test_a_request_leaves_no_workers_behind_on_its_thread():
    """Every request runs through ThreadPolicy.paced: when it ends, its thread's pool goes."""
    started = []

    def request():
        before = _os_threads()
        yield _parallel_work()
        started.extend(_os_threads() - before)
        yield _parallel_work()

    def body():
        results = list(ThreadPolicy(max_threads=2, adaptive=False).paced(request()))
        return _gone(set(started)), results

    gone, results = _on_a_new_thread(body)
    assert len(started) == 1 and gone and len(results) == 2
