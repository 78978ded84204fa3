"""Giving a rank's freed memory back to the system.

glibc's allocator keeps what a program frees for its next allocations. Blocks above its mmap
threshold get mappings of their own, unmapped when freed, but the threshold follows what the
program frees (up to 32 MiB), so tensors of a few megabytes soon come from the heap, and a
rank that dropped a thousand of them keeps them all resident: the memory the mesh view shows
for it never comes down. The tensor engine reports what it frees; once that adds up to
`TRIM_AFTER` bytes, or to a quarter of the rank's resident memory if more, the rank asks glibc
to return its free pages (``malloc_trim``, which also releases free pages inside the heap, not
only at its end). That costs about 0.1 ms per MiB returned (and pages used again are faulted in
again), so a loop that keeps making and dropping tensors trims once per quarter of its
footprint, not every step. What was freed short of that quarter (at least `TRIM_AFTER`) goes
back `IDLE_TRIM_S` later, from a timer: at most once a second, however busy the loop, and the
last frees of a burst do not stay resident. Elsewhere (musl, macOS) nothing happens.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import threading
from typing import Any

from viceroy.runtime import resources

TRIM_AFTER = 32 << 20  # bytes freed since the last trim, at least
IDLE_TRIM_S = 1.0  # what was freed short of a quarter of the footprint goes back this much later

_lock = threading.Lock()
_state: dict[str, Any] = {"freed": 0, "timer": None}  # bytes freed since the last trim; the timer armed


@functools.cache
def _malloc_trim() -> Any:
    """glibc's ``malloc_trim``, or None where the C library has none."""
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c") or None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def freed(nbytes: int) -> bool:
    """Note that `nbytes` of memory were just freed (the caller holds no reference to them any
    more); once enough have been (see above), hand the allocator's free pages back to the
    system. Whether it did now."""
    with _lock:
        _state["freed"] += nbytes
        if _state["freed"] < TRIM_AFTER:
            return False
        if _state["freed"] < (resources.rss() or 0) // 4:
            if _state["timer"] is None:  # the rest goes back a little later, if no trim comes first
                timer = _state["timer"] = threading.Timer(IDLE_TRIM_S, _trim_later)
                timer.name, timer.daemon = "viceroy-heap-trim", True
                timer.start()
            return False
        _state["freed"] = 0
    return _trim()


def _trim_later() -> None:
    with _lock:
        _state["timer"] = None
        if _state["freed"] < TRIM_AFTER:  # trimmed meanwhile
            return
        _state["freed"] = 0
    _trim()


def _trim() -> bool:
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


os.register_at_fork(after_in_child=lambda: _state.update(timer=None))  # the timer's thread stays behind
