"""A signal wakes a rank's main thread in its wait for the next call, whichever of the rank's
threads the system gave it to.

Python runs signal handlers on the main thread; the C handler only notes the signal, in the
thread the system picked. For a signal sent to the process that is any thread not blocking it:
the main one most often, but the rank's IO and output threads (and a library's) too. The main
thread, blocked in a read between calls, then slept on: the handler ran only when the next call
came (a timeout's handler, a SIGTERM handler that exits). So that thread waits for its next
message and for the wakeup fd (`signal.set_wakeup_fd`) at once: for every signal with a Python
handler, the system writes a byte there from whichever thread took it, and the handler runs as
soon as the main thread is back in Python.

A wakeup fd the user set (asyncio's ``add_signal_handler`` sets one; its loop learns of signals
there) is kept: `signal.set_wakeup_fd` is wrapped to note it, it is the system's while the
user's code runs, ours replaces it only while the main thread waits between calls, and the bytes
that came meanwhile are passed on to it. One set past `signal.set_wakeup_fd` (through
``_signal``, or in C) is not known: a signal given to another thread between calls then waits
for the next call, as it did before.
"""

from __future__ import annotations

import functools
import os
import select
import signal
import socket
from typing import Any

import zmq


class SignalWakeup:
    """Made on the main thread (it takes the process's wakeup fd), and used by it only."""

    def __init__(self) -> None:
        self._r, self._w = socket.socketpair()
        self._r.setblocking(False)
        self._w.setblocking(False)
        self._rfd, self._wfd = self._r.fileno(), self._w.fileno()
        self._polls: dict[Any, Any] = {}  # what is waited on: the poll method watching it and ours
        self._theirs: tuple[int, bool] | None = None  # the user's wakeup fd, and its warn flag
        self._real = real = signal.set_wakeup_fd
        real(self._wfd, warn_on_full_buffer=False)

        @functools.wraps(real)
        def set_wakeup_fd(fd: int, /, *, warn_on_full_buffer: bool = True) -> int:
            # the real one checks the thread and the fd; -1 (none) puts ours back
            real(self._wfd if fd == -1 else fd, warn_on_full_buffer=warn_on_full_buffer and fd != -1)
            before, self._theirs = self._theirs, None if fd == -1 else (fd, warn_on_full_buffer)
            return -1 if before is None else before[0]

        signal.set_wakeup_fd = set_wakeup_fd

    def until_ready(self, source: int | zmq.Socket[Any]) -> None:
        """Return once `source` (an fd, or a ZeroMQ socket) has something to read (or hung up),
        running the handlers of signals that come meanwhile."""
        poll = self._polls.get(source)
        if poll is None:
            poll = self._polls[source] = self._poller(source)
        theirs = self._theirs
        if theirs is not None:
            self._real(self._wfd, warn_on_full_buffer=False)
        try:
            while not self._ready(poll(), theirs):  # interrupted here: Python runs the handler, polls again
                pass
        finally:
            if theirs is not None:
                self._drain(theirs)
                try:
                    self._real(theirs[0], warn_on_full_buffer=theirs[1])
                except (ValueError, OSError):  # closed meanwhile (by a handler, say): ours stays
                    if self._theirs is theirs:
                        self._theirs = None

    def _ready(self, events: list[tuple[Any, int]], theirs: tuple[int, bool] | None) -> bool:
        ready = False
        for got, _ in events:
            if got == self._rfd:
                self._drain(theirs)
            else:
                ready = True
        return ready

    def _poller(self, source: int | zmq.Socket[Any]) -> Any:
        if isinstance(source, int):
            poller: Any = select.poll()
            poller.register(source, select.POLLIN)
            poller.register(self._rfd, select.POLLIN)
        else:
            poller = zmq.Poller()
            poller.register(source, zmq.POLLIN)
            poller.register(self._rfd, zmq.POLLIN)
        return poller.poll

    def _drain(self, theirs: tuple[int, bool] | None) -> None:
        """Read the signals' bytes; the user's wakeup fd gets them too."""
        got = b""
        while True:
            try:
                chunk = self._r.recv(4096)
            except (BlockingIOError, InterruptedError):
                break
            if not chunk:
                break
            got += chunk
        if got and theirs is not None:
            try:
                os.write(theirs[0], got)
            except OSError:  # full, or closed: as the system would have dropped them
                pass
