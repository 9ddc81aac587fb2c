"""Keeping the cyclic garbage collector off what a model load leaves behind.

After the default pair loads, the process holds ~400k container objects that live as long as it
does (the modules, functions and tables of torch, transformers and the tokenizer). CPython's
collector walks every one of them in each full collection: ~0.2 s with the GIL held, measured on
the default pair (0.0 ms once frozen), taken from whatever runs when a threshold trips: a
server's streams, a timed run, the window's event loop. ``gc.freeze`` moves them to a generation
the collector never scans; objects made later are collected as before.

Call it on the thread that may collect: the CLI's main thread, the window's GUI thread
(app.shell.gui_gc.settle; never the app's engine thread, where freeing a Qt object crashes).
"""
from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger(__name__)


def freeze_long_lived() -> None:
    """Collect once, then exempt everything alive from later collections. Unfrozen first: what
    an earlier load left and has been dropped since (a model switched away from) is collected
    now, not kept for the life of the process."""
    start = time.perf_counter()
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    log.debug("froze %d long-lived objects in %.2f s", gc.get_freeze_count(), time.perf_counter() - start)
