"""Hand freed heap memory back to the operating system between the phases of a training step.

A step alternates two allocation patterns: the rollout (a decode thread's keys/values and
activations, many sizes) and the update (the main thread's activations and gradients). glibc
keeps freed chunks for reuse in the arena of the thread that allocated them, and the resident
size can climb from step to step while the live tensors do not: the search recipe sampling from a
bf16 copy went 5 → 19 GB over four steps (docs/learning.md 10.6). ``malloc_trim(0)`` walks every
arena and returns its whole free pages; called after every phase, it brought that run back to
4.2 GB after each step and held its peak at 10.6 GB, so the growth was free heap. Returned pages
are faulted in again by the next phase, and keeping freed buffers is what makes ``make demo``'s
malloc tuning faster (20-25% a step, the Makefile's note), so the trainer trims only once the
process holds more than half of the machine's memory (13.8 GB at most in that run): below that,
kept pages cost nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys
from collections.abc import Callable

TRIM_ABOVE = 0.5
"""The share of physical memory above which :func:`release_free_heap` trims by default."""


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none (macOS, musl, Windows)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def resident_share() -> float:
    """This process's resident memory as a share of the machine's physical memory (0 if unknown)."""
    try:
        with open("/proc/self/statm") as f:
            resident_pages = int(f.read().split()[1])
        return resident_pages / os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError, IndexError):
        return 0.0


def release_free_heap(above: float = TRIM_ABOVE) -> bool:
    """Return the heap's free pages to the OS (glibc) if this process holds more than ``above`` of
    physical memory (``0``: always). True if it trimmed."""
    trim = _malloc_trim()
    if trim is None or resident_share() <= above:
        return False
    trim(0)
    return True


__all__ = ["TRIM_ABOVE", "release_free_heap", "resident_share"]
