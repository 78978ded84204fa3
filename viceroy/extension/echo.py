"""Output of mesh calls made from Python (``mesh.run(...)`` in an ordinary cell).

``%%mesh`` cells render their own call's output on the main thread. A call made through the
Python API blocks the main thread (or runs in the background), so its events are rendered as
they arrive, on the runtime's IO thread, with the same grouping. Writing to the kernel's output
streams only buffers (no flush here), and ipykernel flushes them before it shows a cell's
result, so a call's lines come before its value. A small timer thread releases lines whose
grouping window has passed.

Each call's output goes to the cell that made the call (`CallCells`), even once that cell has
ended: a ``block=False`` call's, and what a rank writes between calls (a thread a cell started
there, printing later), which belongs to the cell of the rank's latest call.

>>> echo = ApiEcho()
>>> echo.put({"type": "call_started", "call": 3, "ranks": [0, 1], "label": ""})
>>> echo.put({"type": "output", "rank": 0, "stream": "stdout", "text": "hi\\n", "call": 3})
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from viceroy.extension.displays import CellSink, Sink
from viceroy.extension.live import LiveOutput

IDLE_CLOSE_S = 1.0  # a call with no event for this long has its partial lines flushed


def current_cell() -> dict[str, Any] | None:
    """The header of the request (the cell) this thread runs for, in a kernel; else None."""
    return getattr(sys.stdout, "parent_header", None) or None


class CallCells:
    """Which cell each call's output belongs to: the cell running on the thread that started
    the call; and, for what a rank writes between calls (no call runs there), the cell of that
    rank's latest call. Remembers the calls some rank ran last, and a few more."""

    def __init__(self) -> None:
        self._cell: dict[Any, dict[str, Any] | None] = {}  # call -> its cell's header
        self._latest: dict[int, Any] = {}  # rank -> its latest call
        self._lock = threading.Lock()  # calls start on any thread; events come on the IO thread

    def started(self, ev: dict[str, Any], cell: dict[str, Any] | None) -> None:
        """A ``call_started`` event, on the thread that started the call (in ``cell``)."""
        with self._lock:
            self._cell[ev["call"]] = cell
            for rank in ev.get("ranks") or ():
                self._latest[rank] = ev["call"]
            if len(self._cell) > 2 * len(self._latest) + 64:  # forget calls no rank ran last
                keep = set(self._latest.values())
                self._cell = {c: h for c, h in self._cell.items() if c in keep}

    def call_of(self, ev: dict[str, Any]) -> Any:
        """The call an output event belongs to: its own, or its rank's latest (None if none)."""
        call = ev.get("call")
        if call is not None:
            return call
        with self._lock:
            return self._latest.get(ev.get("rank", -1))

    def cell_of(self, call: Any) -> dict[str, Any] | None:
        with self._lock:
            return self._cell.get(call)


class ApiEcho:
    """Renders events of calls not owned by a running ``%%mesh`` cell; an event's ``parent``
    (a cell's request header) says which cell it goes to (None: the current one)."""

    def __init__(
        self,
        all_ranks: Callable[[], Sequence[int]] = list,
        sink_factory: Callable[[dict[str, Any] | None], Sink] = lambda parent: CellSink(flush=False, parent=parent),
    ) -> None:
        self._all_ranks = all_ranks
        self._sink_factory = sink_factory
        self._calls: dict[Any, list[Any]] = {}  # call -> [LiveOutput, time of its last event]
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = False
        self._thread: threading.Thread | None = None

    def put(self, ev: dict[str, Any]) -> None:
        """Render one runtime event (called on the runtime's IO thread)."""
        with self._lock:
            self._handle(ev, time.monotonic())
            if self._thread is None and not self._stopped:
                self._thread = threading.Thread(
                    target=self._timer, name="viceroy-echo", daemon=True
                )
                self._thread.start()
        if ev.get("type") in ("output", "publish"):
            # Only lines wait for a grouping window; waking the timer for every bookkeeping
            # event would make it fight the caller for the GIL on every call.
            self._wake.set()

    def stop(self) -> None:
        """Flush everything and end the timer thread."""
        with self._lock:
            self._stopped = True
            for live, _ in self._calls.values():
                live.close()
            self._calls.clear()
        self._wake.set()

    def _live(self, call: Any, ranks: Sequence[int] | None = None, parent: dict[str, Any] | None = None) -> LiveOutput:
        entry = self._calls.get(call)
        if entry is None:
            live = LiveOutput(list(ranks or self._all_ranks()), call, self._sink_factory(parent))
            entry = self._calls[call] = [live, 0.0]
        entry[1] = time.monotonic()
        return entry[0]

    def _handle(self, ev: dict[str, Any], now: float) -> None:
        kind = ev.get("type")
        if kind == "call_started":
            self._live(ev["call"], ev.get("ranks"), ev.get("parent"))
        elif kind in ("output", "publish", "rank_done", "ranks_done") and (
            kind not in ("rank_done", "ranks_done") or ev.get("call") in self._calls
        ):
            self._live(ev.get("call"), parent=ev.get("parent")).handle(ev, now)
        elif kind == "call_finished" and ev.get("call") in self._calls:
            live, _ = self._calls.pop(ev["call"])
            live.close()

    def _timer(self) -> None:
        while True:
            with self._lock:
                if self._stopped:
                    return
                now = time.monotonic()
                for call, (live, last) in list(self._calls.items()):
                    live.tick(now)
                    if now - last > IDLE_CLOSE_S:
                        live.close()
                        del self._calls[call]
                waits = [live.next_wakeup(now) for live, _ in self._calls.values()]
            self._wake.wait(timeout=min(waits, default=None))
            self._wake.clear()
