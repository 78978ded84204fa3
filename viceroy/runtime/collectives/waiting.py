"""Waiting that an interrupt can end, and bookkeeping that an interrupt must not cut short.

The runtime interrupts a rank by raising KeyboardInterrupt in its main thread, which Python can
only do between bytecodes: a thread blocked in a C++ wait never sees it. So every wait of the
data plane is a loop of short native waits (`SLICE_S`) with Python in between.
"""

from __future__ import annotations

import _signal
import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

SLICE_S = 0.05
_SIGINT = int(signal.SIGINT)


def sleep_slice(seconds: float) -> None:
    time.sleep(min(seconds, SLICE_S))


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """SIGINT does not raise inside the block (main thread only; elsewhere signals never run).

    The Python-level handler is swapped rather than the signal masked: a signal that arrived
    just before the block, whose handler Python has not run yet, then runs the placeholder
    too. A held interrupt is dropped: the rank runtime resends its interrupt until the call
    ends. Swapped with the C-level `_signal.signal` (0.6 us the pair; `signal.signal` converts to
    and from enums, and on a rank wraps the handler: ~10 us, on every collective); a handler set
    outside Python (getsignal None) is left alone."""
    if threading.current_thread() is not threading.main_thread() or _signal.getsignal(_SIGINT) is None:
        yield
        return
    previous = _signal.signal(_SIGINT, _hold)
    try:
        yield
    finally:
        _signal.signal(_SIGINT, previous)


def _hold(signum: int, frame: Any) -> None:
    pass


def uninterrupted(cleanup: Callable[[], object]) -> None:
    """Run an idempotent `cleanup` to its end though interrupts keep coming: one that lands
    before the hold takes effect (or just as it ends) runs it again."""
    while True:
        try:
            with interrupts_held():
                cleanup()
            return
        except KeyboardInterrupt:
            continue
