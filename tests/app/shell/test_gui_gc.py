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


def test_a_loaded_model_is_frozen_out_of_later_collections(qtbot, make_window):
    """After a load the GUI thread's collections skip the models' objects: scanning them made a
    collection take 60-300 ms with the GIL held (the window froze)."""
    window = make_window()

    session = window.host.worker.state.session
    assert session is not None
    model = session.target.model
    assert gc.get_freeze_count() > 1000
    assert not any(obj is model for obj in gc.get_objects())  # frozen: no generation holds it


def test_settling_frees_what_an_earlier_settle_froze(qtbot, make_window):
    """A replaced model's cycles were frozen while it was alive; the next load's settle frees them."""
    from app.shell import gui_gc

    make_window(load=False)
    freed_on: list[str] = []
    witness = _CycleWitness(freed_on)
    gui_gc.settle()  # alive now: frozen with everything else
    del witness
    gc.collect()
    assert freed_on == []  # frozen garbage is not collected
    gui_gc.settle()
    assert freed_on == [threading.main_thread().name]
