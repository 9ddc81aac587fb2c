"""The thread policy: torch's threads follow the cores other programs leave free."""
import psutil
import pytest
import torch

from engine.bench.background_load import BackgroundLoad
from engine.core.threads import ThreadPolicy, threads_for


@pytest.mark.parametrize("cpus, others, max_threads, expected", [
    (2, 0.0, 2, 2),
    (2, 0.3, 2, 2),    # a browser tab's background work does not cost a thread
    (2, 0.67, 2, 1),   # one busy thread sharing the cores with our two
    (2, 1.0, 2, 1),
    (2, 2.0, 2, 1),    # never none
    (8, 3.0, 8, 5),
    (8, 0.0, 4, 4),    # at most what the user allows
    (8, -0.1, 8, 8),   # a counter's rounding below zero
])
def test_threads_for_the_free_cores(cpus, others, max_threads, expected):
    assert threads_for(cpus, others, max_threads) == expected


def _until(policy: ThreadPolicy, done, limit: int = 200) -> None:
    """Sample until ``done(policy)``; the limit only ends a hang (each sample waits for the
    interval, measured by the machine's own CPU counters, not by a sleep that must be long enough)."""
    for _ in range(limit):
        psutil.cpu_percent(interval=policy.interval_s)  # let the interval pass, doing no work
        policy.adjust()
        if done(policy):
            return
    raise AssertionError(f"the policy never got there: {policy.threads} threads, others {policy.others_cores}")


@pytest.mark.skipif((psutil.cpu_count() or 1) < 2, reason="one core: nothing to give up")
def test_busy_threads_beside_us_take_a_thread_and_give_it_back():
    cpus = psutil.cpu_count()
    policy = ThreadPolicy(max_threads=cpus, interval_s=0.2)
    before = torch.get_num_threads()
    # What other programs already keep busy: where they fill the cores by themselves, the load's
    # end cannot free one (its threads only shared them), so only the taking is checked then.
    _until(policy, lambda p: p.others_cores is not None)
    already = policy.others_cores
    try:
        with BackgroundLoad(threads=cpus):
            _until(policy, lambda p: p.threads < cpus)
            busy = policy.others_cores
            assert busy > 0.5 and torch.get_num_threads() == policy.threads
        if already > cpus - 0.5:
            pytest.skip(f"other programs kept {already:.1f} of {cpus} cores busy before the load: none to give back")
        # The spinning threads stopped: what others use falls by about their cores.
        _until(policy, lambda p: p.others_cores is not None and p.others_cores < busy - 0.5 * (busy - already))
    finally:
        torch.set_num_threads(before)


def test_a_fixed_policy_keeps_its_count():
    before = torch.get_num_threads()
    try:
        policy = ThreadPolicy(max_threads=1, adaptive=False)
        assert policy.adjust() == 1 and torch.get_num_threads() == 1
        assert policy.describe_last() == "1 threads (fixed)"
    finally:
        torch.set_num_threads(before)


def test_a_request_runs_paced_and_leaves_torchs_count_as_it_found_it():
    before = torch.get_num_threads()
    policy = ThreadPolicy(max_threads=before, interval_s=0.0)
    seen = []

    def steps():
        for i in range(3):
            seen.append(torch.get_num_threads())
            torch.set_num_threads(1)  # whatever a step does to the count
            yield i

    assert list(policy.paced(steps())) == [0, 1, 2]
    # Every step ran with the policy's count, not the one the step before left behind.
    assert seen[0] == before and all(n in policy.used for n in seen)
    assert torch.get_num_threads() == before
    # Abandoned half-way (a consumer that stops reading): the count is put back too.
    events = policy.paced(steps())
    next(events)
    events.close()
    assert torch.get_num_threads() == before


def test_a_requests_stats_say_the_fewest_threads_it_ran_with():
    from engine.core.events import Finished, RunStats, Stats, Tokens

    policy = ThreadPolicy(max_threads=torch.get_num_threads(), interval_s=0.0)

    def steps():
        yield Tokens("a", (1,), (False,), 0, 0, 1.0)
        yield Stats(RunStats(new_tokens=1))
        yield Finished("eos", RunStats(new_tokens=1))

    events = list(policy.paced(steps()))
    assert events[0] == Tokens("a", (1,), (False,), 0, 0, 1.0)
    for event in events[1:]:
        assert event.stats.threads_fewest == min(policy.used) >= 1
        assert event.stats.threads_max == policy.max_threads
