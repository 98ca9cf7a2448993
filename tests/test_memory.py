"""release_free_heap: freed heap pages leave the process, where glibc can return them."""

from __future__ import annotations

import os
import sys

import pytest

from flowgrpo.utils.memory import release_free_heap, resident_share


def _resident_bytes() -> int:
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_freed_heap_pages_are_returned_to_the_os() -> None:
    blocks = [bytearray(64 * 1024) for _ in range(3000)]  # ~197 MB of heap chunks
    keep = blocks[::10]  # every tenth stays, so the freed space is not one block at the heap's top
    del blocks
    assert release_free_heap(above=1.0) is False  # below the threshold: the pages stay for reuse
    before = _resident_bytes()
    assert release_free_heap(above=0.0)
    released = before - _resident_bytes()
    assert released > 0.5 * 2700 * 64 * 1024, f"released {released / 1e6:.0f} MB of ~177 MB freed"
    assert len(keep) == 300


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_resident_share_is_resident_over_physical_memory() -> None:
    share = resident_share()
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert share == pytest.approx(_resident_bytes() / physical, rel=0.05)
    assert 0.0 < share < 1.0


def test_it_is_a_no_op_without_glibc(monkeypatch) -> None:
    from flowgrpo.utils import memory

    memory._malloc_trim.cache_clear()
    monkeypatch.setattr(memory.sys, "platform", "darwin")
    try:
        assert release_free_heap(above=0.0) is False
    finally:
        memory._malloc_trim.cache_clear()
