"""Keep Python's cyclic garbage collector on the GUI thread while a window is open.

The collector runs in whichever thread happens to allocate when its threshold trips. On the
engine thread that is often mid-load (transformers allocates a lot), and if the garbage it finds
holds a Qt object (a closed dialog, an old window's widgets in a reference cycle), that object is
destroyed off the GUI thread and the process segfaults. We saw exactly that: a crash in
``from_pretrained`` on the worker, "Garbage-collecting" at the top of its stack.

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
