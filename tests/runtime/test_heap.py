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


def test_what_was_freed_short_of_a_quarter_of_the_footprint_goes_back_a_second_later():
    """The last frees of a burst, too few to trim at once in a big process, do not stay."""
    code = """
import ctypes, time
from viceroy.runtime import heap, resources
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
footprint = libc.malloc(512 << 20)  # in use throughout: a quarter of it is more than is freed below
ctypes.memset(footprint, 1, 512 << 20)
libc.free(libc.malloc(16 << 20))
blocks = [libc.malloc(1 << 20) for _ in range(96)]
for b in blocks:
    ctypes.memset(b, 1, 1 << 20)
for b in blocks[:-1]:
    libc.free(b)
kept = resources.rss()
t0 = time.monotonic()
at_once = heap.freed(95 << 20)
after_call = resources.rss()
while resources.rss() > kept - (64 << 20) and time.monotonic() < t0 + 10:
    time.sleep(0.02)
print(int(at_once), kept >> 20, after_call >> 20, resources.rss() >> 20, time.monotonic() - t0)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    at_once, kept, after_call, later, waited = out.stdout.split()
    assert at_once == "0" and int(after_call) > int(kept) - 32, out.stdout  # not at once: loops stay cheap
    assert int(later) < int(kept) - 64, f"rss {kept} MiB before, {later} MiB {waited} s after"
    assert float(waited) >= heap.IDLE_TRIM_S * 0.9
