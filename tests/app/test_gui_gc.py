"""Cyclic garbage is collected on the GUI thread while a window is open, never on the engine thread.

Collecting on the worker destroyed Qt objects off the GUI thread and segfaulted model loads.
"""
import gc
import threading


class _CycleWitness:
    """Garbage only the cyclic collector can free; it records which thread freed it."""

    def __init__(self, freed_on: list[str]) -> None:
        self.me = self
        self.freed_on = freed_on

    def __del__(self) -> None:
        self.freed_on.append(threading.current_thread().name)


def _allocate_containers(ctx) -> None:
    # Far past generation 0's threshold: with automatic collection on, this thread would collect.
    keep = [[i] for i in range(200_000)]
    del keep


def test_cycles_are_freed_on_the_gui_thread_not_the_worker(qtbot, make_window):
    window = make_window(load=False)
    assert not gc.isenabled()
    freed_on: list[str] = []
    _CycleWitness(freed_on)
    done = []
    window.host.submit("allocate", lambda ctx: (_allocate_containers(ctx), done.append(True)))
    qtbot.waitUntil(lambda: bool(done), timeout=10_000)
    assert freed_on in ([], [threading.main_thread().name])  # the worker did not free it
    # Freed objects lower the collector's allocation count again: allocate (and keep) enough
    # here that the GUI-thread timer's next look finds generation 0 over its threshold.
    kept = [[i] for i in range(gc.get_threshold()[0] * 2)]
    qtbot.waitUntil(lambda: bool(freed_on), timeout=10_000)  # the GUI-thread timer frees it
    assert freed_on == [threading.main_thread().name]
    del kept


def test_closing_the_last_window_hands_collection_back(qtbot, make_window):
    first, second = make_window(load=False), make_window(load=False)
    first.close()
    assert not gc.isenabled()  # one window still open
    second.close()
    assert gc.isenabled()
