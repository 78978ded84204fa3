"""A ZeroMQ socket that one thread's loop reads through a `ZMQStream`, shared with other
threads that send on it directly.

ipykernel gives each of its sockets to one thread (the shell socket to its shell-channel
thread, IOPub to its IOPub thread), and other threads hand their messages over: a wake-up of
that thread and an interpreter-lock hand-off per message, which on a machine with few CPUs
costs more than the send. A ZeroMQ socket may move between threads but never be used by two at
once, so sharing one takes a lock that every use takes, the owner's included:

- `SharedSocket.send` sends under the lock, on the caller's thread;
- the stream's event handler runs under it: registered with the loop as a bound method, it is
  registered again, on the owner's thread (a loop's handlers are its own thread's to change),
  and set on the stream, where the stream's own follow-ups look it up;
- `SharedSocket.lock` is there for the owner's other uses (its own sends, closing);
- on the main thread, Ctrl-C's handler waits for the end of a send: a KeyboardInterrupt
  between two frames would leave half a message in the socket, glued to the next one.
  ipykernel's threads never had that to fear: signals run on the main thread.

A send takes in whatever the peers sent meanwhile (a request, a subscription), after which the
socket's descriptor no longer wakes the owner's loop (it tells of changes, not of what waits):
so after each send the socket is asked whether something waits, and if so the owner's loop is
told to read it. ipykernel's own hand-offs avoid the same trap by sending through the stream.
"""

from __future__ import annotations

import _signal
import signal
import threading
from collections.abc import Callable
from typing import Any, TypeVar, cast

import zmq

T = TypeVar("T")
_MAIN = threading.main_thread().ident
_SIGINT = int(signal.SIGINT)
SWAP_TIMEOUT_S = 10.0  # for the owner's loop to take the locked handler


class SharedSocket:
    def __init__(self, socket: zmq.Socket, loop: Any = None, stream: Any = None) -> None:
        """`socket` is read by `stream` (a `ZMQStream`) on `loop` (a tornado IOLoop, running on
        its own thread, not this one); a socket nothing reads (a PUB) has neither."""
        self.socket = socket
        self.loop = loop
        self.lock = threading.RLock()
        self._read: Callable[[Any, int], None] | None = None
        if stream is not None:
            self._lock_reads(stream)

    def send(self, send: Callable[[], T]) -> T:
        """Run `send` (a send on the socket) under the lock, then have the owner read whatever
        the send took in. On the main thread, an interrupt (SIGINT's handler) that comes
        meanwhile runs once the message is out: between two of its frames it would leave half a
        message in the socket, and the next message's frames would be glued to it."""
        if threading.get_ident() == _MAIN:
            handler = _signal.getsignal(_SIGINT)
            if handler is not None and handler != signal.SIG_IGN:  # ipykernel's, between requests
                return _holding_interrupts(handler, lambda: self._send(send))
        return self._send(send)

    def _send(self, send: Callable[[], T]) -> T:
        with self.lock:
            result = send()
            try:
                waiting = (
                    self._read is not None
                    and not self.socket.closed
                    and bool(cast(int, self.socket.getsockopt(zmq.EVENTS)) & zmq.POLLIN)
                )
            except zmq.ZMQError:
                waiting = False
        if waiting:
            self.loop.add_callback(self._read, self.socket, 0)
        return result

    def _lock_reads(self, stream: Any) -> None:
        socket, loop = self.socket, self.loop
        handle = stream._handle_events
        lock = self.lock

        def locked(fd: Any, events: int) -> None:
            with lock:
                handle(fd, events)

        self._read = locked
        done = threading.Event()
        failed: list[BaseException] = []

        def swap() -> None:
            try:
                loop.remove_handler(socket)
                stream._handle_events = locked
                loop.add_handler(socket, locked, loop.READ)
            except BaseException as e:
                failed.append(e)
            finally:
                done.set()

        loop.add_callback(swap)
        if not done.wait(SWAP_TIMEOUT_S):
            raise RuntimeError(f"the socket's thread did not take the stream's new handler in {SWAP_TIMEOUT_S:g} s")
        if failed:
            raise failed[0]


def _holding_interrupts(handler: Any, run: Callable[[], T]) -> T:
    """On the main thread, with `handler` SIGINT's Python handler: hold it while `run` runs, then
    run it (once, however many came). Swapped with the C-level `_signal.signal`, as
    `runtime/collectives/waiting.py` does (~10x cheaper than `signal.signal`), but the held
    interrupt is run here, not dropped: nobody sends a user's Ctrl-C twice."""
    came: list[Any] = []
    _signal.signal(_SIGINT, lambda _signum, frame: came.append(frame))
    try:
        return run()
    finally:
        _signal.signal(_SIGINT, handler)
        if came:
            if callable(handler):
                handler(_SIGINT, came[0])
            elif handler == signal.SIG_DFL:
                signal.raise_signal(_SIGINT)
