"""Runtime events on their way to the thread running a cell.

The runtime's IO thread posts every event of the cell; only some need the cell's thread at
once (output to stream, a rank exiting, the value arriving). The rest (a silent rank finishing,
bookkeeping) ride along without waking it, and are handled, in order, with the next event that
does or at its next periodic wake-up. Each wake-up of a waiting thread is a context switch and
a GIL hand-off while the IO thread is still reading answers, so a cell that prints nothing
wakes once, when its value is in.
"""

from __future__ import annotations

import collections
import queue
from typing import Any

Event = dict[str, Any]


class Inbox:
    """Many posting threads, one taking thread; events come out in the order they were posted."""

    def __init__(self) -> None:
        self._events: collections.deque[Event] = collections.deque()
        # One token per waking post (a C queue: cheaper than threading.Event's Python lock).
        self._bell: queue.SimpleQueue[None] = queue.SimpleQueue()

    def post(self, ev: Event, wake: bool = True) -> None:
        self._events.append(ev)
        if wake:
            self._bell.put(None)

    def put_back(self, events: list[Event]) -> None:
        """Events taken but not handled (the taker was interrupted): first out next time."""
        self._events.extendleft(reversed(events))

    def take(self, timeout: float, limit: int = 2000) -> list[Event]:
        """Up to `limit` events, waiting up to `timeout` seconds for one that wakes the taker
        when none is queued (events queued without waking are taken at once)."""
        if not self._events and timeout > 0:
            try:
                self._bell.get(timeout=timeout)
            except queue.Empty:
                pass
        for _ in range(self._bell.qsize()):  # tokens of the events taken below (or earlier)
            self._bell.get_nowait()
        out: list[Event] = []
        while len(out) < limit:
            try:
                out.append(self._events.popleft())
            except IndexError:
                break
        return out
