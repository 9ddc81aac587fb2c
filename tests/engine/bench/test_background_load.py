"""The bench's background load: busy threads that really burn CPU, memory really held, and both
children gone when the block ends, however it ends."""
import time

import psutil
import pytest

from engine.bench.background_load import BackgroundLoad


def _gone(pids, within=10.0) -> bool:
    """Every pid ended (reaped, or at least a zombie no longer running)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive:
            return True
        time.sleep(0.05)
    return False


def _cpu_seconds(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def test_the_busy_threads_burn_cpu_in_a_child_process():
    with BackgroundLoad(threads=1) as load:
        [child] = load.children
        assert child.pid != psutil.Process().pid
        before, start = _cpu_seconds(child.pid), time.perf_counter()
        time.sleep(1.5)
        used, wall = _cpu_seconds(child.pid) - before, time.perf_counter() - start
        described = load.describe()
    # One busy thread, on a machine shared with other work: a good part of a core, not idle.
    assert used > 0.25 * wall, (used, wall)
    assert described["threads"] == 1 and described["busy_cores"] > 0.2
    assert _gone([child.pid])


def test_the_memory_child_holds_the_memory_asked_for():
    with BackgroundLoad(memory_gb=0.25) as load:
        [child] = load.children
        rss = psutil.Process(child.pid).memory_info().rss
        described = load.describe()
    assert rss >= 0.95 * 0.25e9, rss  # every page written: resident, not just reserved
    assert described["memory_gb"] == 0.25 and described["memory_rss_gb"] >= 0.95 * 0.25
    assert _gone([child.pid])


def test_a_load_that_leaves_memory_takes_what_was_available_but_that():
    # Leave all but ~0.2 GB of what is available now: the child holds what the start measured, less the leave.
    leave = max(0.0, psutil.virtual_memory().available / 1e9 - 0.2)
    with BackgroundLoad(memory_left_gb=leave) as load:
        described = load.describe()
        rss = [psutil.Process(child.pid).memory_info().rss for child in load.children]
    expected = round(max(0.0, described["available_at_start_gb"] - leave), 3)
    assert described["memory_left_gb"] == leave and described["memory_gb"] == expected
    assert len(rss) == (1 if expected else 0) and all(r >= 0.95 * expected * 1e9 for r in rss), (rss, expected)
    assert f"all but {leave:g} GB of what was available" in load.text()


def test_a_child_that_ends_before_the_load_is_stopped_is_reported():
    # As the out-of-memory killer ends a memory child: the runs after it were not under the load.
    with BackgroundLoad(memory_gb=0.05) as load:
        [child] = load.children
        assert load.describe()["ended_early"] == {}
        child.kill()
        child.wait()
        described = load.describe()
    assert described["ended_early"] == {"memory": -9}
    assert "the memory child ended early with status -9" in load.text() and "out-of-memory" in load.text()


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_both_children_are_stopped_when_the_block_raises(error):
    with pytest.raises(error):
        with BackgroundLoad(threads=2, memory_gb=0.05) as load:
            pids = [p.pid for p in load.children]
            assert len(pids) == 2 and all(psutil.pid_exists(p) for p in pids)
            raise error("the bench failed")
    assert _gone(pids)
    assert all(p.poll() is not None for p in load.children)  # reaped: no zombies left behind


def test_a_child_that_ignores_sigterm_is_killed_after_the_timeout():
    load = BackgroundLoad(threads=1, stop_timeout=0.5).start()
    [child] = load.children
    psutil.Process(child.pid).suspend()  # a stopped process does not act on SIGTERM
    load.stop()
    assert child.poll() is not None and _gone([child.pid])


def test_the_children_end_themselves_when_the_parent_goes_away():
    """A parent killed before it could stop them (SIGKILL, no __exit__): the children see their
    stdin pipe close and exit, instead of spinning on as orphans."""
    load = BackgroundLoad(threads=1, memory_gb=0.05).start()
    pids = [p.pid for p in load.children]
    for proc in load.children:
        proc.stdin.close()  # what the kernel does to the pipe when the parent dies
    try:
        assert _gone(pids)
    finally:
        load.stop()


def test_the_bench_stops_the_load_when_it_fails(tmp_path, monkeypatch):
    """`tandem bench --background-load 1 --memory-pressure ...` failing inside its timed runs: no
    child left running."""
    import engine.bench.background_load as background_load
    import engine.bench.suite as suite
    from engine.cli import main
    from engine.testing.tiny_models import save_pair

    started = []
    real_start = background_load.BackgroundLoad.start

    def start(self):
        real_start(self)
        started.extend(p.pid for p in self.children)
        return self

    def failing_bench(*args, **kwargs):
        assert len(started) == 2 and all(psutil.pid_exists(p) for p in started)  # running during the bench
        raise RuntimeError("a failure inside the timed runs")

    monkeypatch.setattr(background_load.BackgroundLoad, "start", start)
    monkeypatch.setattr(suite, "run_bench", failing_bench)
    target, drafter = save_pair(tmp_path)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "a", "category": "code", "prompt": "def add(a, b):"}\n')
    code = main(["bench", "--target", str(target), "--drafter-model", str(drafter), "--prompts", str(prompts),
                 "--json", str(tmp_path / "bench.json"), "--no-hf", "--no-agreement", "--max-new-tokens", "4",
                 "--threads", "1", "--background-load", "1", "--memory-pressure", "0.05"])
    assert code == 1
    assert len(started) == 2 and _gone(started)


def test_bad_load_settings_are_refused():
    with pytest.raises(ValueError):
        BackgroundLoad(threads=-1)
    with pytest.raises(ValueError):
        BackgroundLoad(memory_gb=-0.5)
    with pytest.raises(ValueError):
        BackgroundLoad(memory_left_gb=-1)
    with pytest.raises(ValueError, match="not both"):
        BackgroundLoad(memory_gb=1, memory_left_gb=1)
    assert not BackgroundLoad().active and BackgroundLoad(memory_left_gb=0).active
