"""What a load leaves is frozen out of the cyclic collector's scans, and what an earlier load
left and was dropped since is still collected by the next one."""
from __future__ import annotations

import gc
import weakref

import pytest

from engine.core.long_lived import freeze_long_lived


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


@pytest.fixture
def unfrozen():
    yield
    gc.unfreeze()


def test_live_objects_are_frozen_and_dropped_ones_collected_by_the_next_freeze(unfrozen):
    kept, dropped = _Node(), _Node()
    gone = weakref.ref(dropped)
    freeze_long_lived()
    assert gc.get_freeze_count() > 0
    del dropped
    gc.collect()
    assert gone() is not None  # frozen: a collection does not scan it
    freeze_long_lived()  # the next load: unfreezes, collects what was dropped, freezes the rest
    assert gone() is None and kept.me is kept


def test_the_cli_freezes_what_it_loaded(unfrozen, tmp_path, capsys):
    from engine.cli import main
    from engine.testing.tiny_models import save_pair

    gc.unfreeze()
    target, drafter = save_pair(tmp_path)
    assert main(["compare", "def f(x):", "--target", str(target), "--drafter-model", str(drafter),
                 "--precision", "fp32", "--max-new-tokens", "4"]) == 0
    assert gc.get_freeze_count() > 0
