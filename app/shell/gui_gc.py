"""Keep Python's cyclic garbage collector on the GUI thread while a window is open.

The collector runs in whichever thread happens to allocate when its threshold trips. On the
engine thread that is often mid-load (transformers allocates a lot), and if the garbage it finds
holds a Qt object (a closed dialog, an old window's widgets in a reference cycle), that object is
destroyed off the GUI thread and the process segfaults (such a crash shows ``from_pretrained``
on the worker with "Garbage-collecting" at the top of its stack).

So while any window is open, automatic collection is off and pyqtgraph's ``GarbageCollector``
collects on the GUI thread from a timer, honouring the same generation thresholds. Reference
counting still frees everything that is not in a cycle at once, on whichever thread drops it.
"""
from __future__ import annotations

import gc

from pyqtgraph.util.garbage_collector import GarbageCollector

_holders = 0
_collector: GarbageCollector | None = None
_was_enabled = True


def hold() -> None:
    """A window opened: collect on the GUI thread from now on. Call on the GUI thread."""
    global _holders, _collector, _was_enabled
    if _holders == 0:
        _was_enabled = gc.isenabled()
        _collector = GarbageCollector(interval=0.5)  # disables automatic collection
    _holders += 1


def settle() -> None:
    """A model finished loading: collect once, then freeze what survives (the models' many
    Python objects) so that later collections skip it. Call on the GUI thread.

    Why: a collection scans every object of its generations. After a load those hold the
    models' objects, so a gen1 collection took 60-150 ms and a full one ~250 ms, with the GUI
    thread holding the GIL throughout: the demo's worst stall was 150-230 ms in about half the
    runs. Frozen objects are never scanned; ``gc.unfreeze`` first makes an earlier load's
    objects collectable again (a replaced model's cycles are freed by the collection here)."""
    from engine.core.long_lived import freeze_long_lived

    freeze_long_lived()


def release() -> None:
    """A window closed; the last one hands collection back to Python, after a full pass here."""
    global _holders, _collector
    if _holders == 0:
        return
    _holders -= 1
    if _holders == 0 and _collector is not None:
        _collector.timer.stop()
        _collector = None
        gc.collect()  # what the windows left behind dies here, on the GUI thread
        if _was_enabled:
            gc.enable()
