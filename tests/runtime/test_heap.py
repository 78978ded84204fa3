"""Returning freed heap memory to the system (`viceroy.runtime.heap`), in a real process."""

import subprocess
import sys

import pytest

from viceroy.runtime import heap

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")


def test_freed_memory_is_returned_once_enough_was_freed(monkeypatch):
    monkeypatch.setitem(heap._state, "freed", 0)
    assert heap.freed(heap.TRIM_AFTER - 1) is False  # not yet: trims cost ~0.1 ms per MiB
    assert heap.freed(1 << 40) is True
    assert heap._state["freed"] == 0  # counting starts again


def test_a_process_that_frees_many_heap_blocks_shrinks():
    """Blocks of 1 MiB after a freed 16 MiB one come from the heap (glibc's mmap threshold
    follows what is freed), and glibc keeps them when freed; `freed` gives them back."""
    code = """
import ctypes
from viceroy.runtime import heap, resources
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.free(libc.malloc(16 << 20))
blocks = [libc.malloc(1 << 20) for _ in range(256)]
for b in blocks:
    ctypes.memset(b, 1, 1 << 20)
full = resources.rss()
for b in blocks[:-1]:  # the last one keeps the heap's top in use: free() alone cannot trim
    libc.free(b)
kept = resources.rss()
heap.freed(255 << 20)
print(full >> 20, kept >> 20, resources.rss() >> 20)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    full, kept, trimmed = map(int, out.stdout.split())
    assert kept > full - 64, f"free() alone gave back {full - kept} MiB: nothing left to show"
    assert trimmed < kept - 192, f"rss {kept} MiB before the trim, {trimmed} MiB after"
