"""Weight buffers moved into huge pages keep their values, and nothing moves where the kernel
does not grant huge pages."""
import re
from pathlib import Path

import pytest
import torch

from engine.models.runners import huge_pages
from engine.quant.quantize import Int4Linear


def _modules():
    gen = torch.Generator().manual_seed(0)
    mods = []
    for n, k in ((64, 96), (1536, 2048)):  # a small buffer and one of a few MiB
        linear = torch.nn.Linear(k, n, bias=False)
        with torch.no_grad():
            linear.weight.copy_(torch.randn(n, k, generator=gen) * 0.05)
        mods.append(Int4Linear(linear))
    return mods


def _buffers(mods):
    return [(m, name) for m in mods for name in ("packed", "scale", "offset")]


def _vm_flags(address: int) -> set[str]:
    """The VmFlags of the mapping of this process that holds ``address``."""
    current = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        span = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
        if span:
            current = int(span[1], 16) <= address < int(span[2], 16)
        elif current and line.startswith("VmFlags:"):
            return set(line.split()[1:])
    return set()


def test_moved_buffers_keep_their_values_and_results():
    if not huge_pages.huge_pages_on_request():
        pytest.skip("this kernel grants no huge pages on request")
    mods = _modules()
    before = {(id(m), name): getattr(m, name).clone() for m, name in _buffers(mods)}
    x = torch.randn(3, 2048, generator=torch.Generator().manual_seed(1))
    want = mods[1](x)
    moved = huge_pages.move_to_huge_pages(_buffers(mods))
    assert moved >= sum(t.numel() * t.element_size() for t in before.values())
    for m, name in _buffers(mods):
        now = getattr(m, name)
        assert now.dtype == before[(id(m), name)].dtype and now.is_contiguous()
        assert torch.equal(now, before[(id(m), name)])
        assert name in m._buffers and m._buffers[name] is now  # still a registered buffer
    first = mods[0].packed.data_ptr()
    assert first % huge_pages.HUGE_PAGE == 0  # the arena starts on a huge page boundary
    assert "hg" in _vm_flags(first)  # the mapping asks for huge pages (MADV_HUGEPAGE)
    assert torch.equal(mods[1](x), want)


def test_nothing_moves_where_huge_pages_are_off(tmp_path, monkeypatch):
    setting = tmp_path / "enabled"
    setting.write_text("always madvise [never]\n")
    monkeypatch.setattr(huge_pages, "_THP_SETTING", setting)
    mods = _modules()
    ptrs = [getattr(m, name).data_ptr() for m, name in _buffers(mods)]
    assert not huge_pages.huge_pages_on_request()
    assert huge_pages.move_to_huge_pages(_buffers(mods)) == 0
    assert [getattr(m, name).data_ptr() for m, name in _buffers(mods)] == ptrs


def test_an_unreadable_setting_means_off(tmp_path, monkeypatch):
    monkeypatch.setattr(huge_pages, "_THP_SETTING", tmp_path / "missing")
    assert not huge_pages.huge_pages_on_request()


def test_a_cache_file_is_unmapped_once_its_buffers_moved(tmp_path):
    """Buffers memory-mapped from a drafter's cache move, and the file's pages are then no longer
    mapped: the weights are resident once."""
    if not huge_pages.huge_pages_on_request():
        pytest.skip("this kernel grants no huge pages on request")
    from safetensors.torch import safe_open, save_file

    mods = _modules()
    path = tmp_path / "cache.safetensors"
    save_file({f"{i}.{name}": getattr(m, name) for i, m in enumerate(mods) for name in ("packed", "scale", "offset")}, path)
    want = {(i, name): getattr(m, name).clone() for i, m in enumerate(mods) for name in ("packed", "scale", "offset")}
    with safe_open(str(path), framework="pt") as f:
        for i, m in enumerate(mods):
            for name in ("packed", "scale", "offset"):
                setattr(m, name, f.get_tensor(f"{i}.{name}"))
    assert huge_pages.move_to_huge_pages(_buffers(mods)) > 0
    assert str(path) not in Path("/proc/self/maps").read_text()
    for i, m in enumerate(mods):
        for name in ("packed", "scale", "offset"):
            assert torch.equal(getattr(m, name), want[(i, name)])


def test_moving_twice_moves_nothing_more():
    if not huge_pages.huge_pages_on_request():
        pytest.skip("this kernel grants no huge pages on request")
    mods = _modules()
    assert huge_pages.move_to_huge_pages(_buffers(mods)) > 0
    ptrs = [getattr(m, name).data_ptr() for m, name in _buffers(mods)]
    assert huge_pages.move_to_huge_pages(_buffers(mods)) == 0
    assert [getattr(m, name).data_ptr() for m, name in _buffers(mods)] == ptrs
