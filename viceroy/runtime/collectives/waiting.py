"""Waiting that an interrupt can end.

The runtime interrupts a rank by raising KeyboardInterrupt in its main thread, which Python can
only do between bytecodes: a thread blocked in a C++ wait never sees it. So every wait of the
data plane is a loop of short native waits (`SLICE_S`) with Python in between.
"""

from __future__ import annotations

import time

SLICE_S = 0.05


def sleep_slice(seconds: float) -> None:
    time.sleep(min(seconds, SLICE_S))
