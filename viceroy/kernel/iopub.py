"""How the kernel's messages reach its IOPub socket, which ipykernel's IOPub thread owns.

ipykernel hands every IOPub message (busy, execute_input, output, comm messages, idle) to its
IOPub thread: a ZeroMQ message to wake the thread, a turn of its loop, and the thread must then
take the interpreter's lock from whoever woke it. Every cell pays for that at least twice (busy
at its start, idle at its end, and the client waits for idle), and on a machine with few CPUs
a wake-up across threads costs more than the send itself. `hand_iopub_over` changes two
things, on an IOPub thread already started:

- **A message goes out on the caller's thread when nothing waits for the IOPub thread** (its
  queue empty, no batch running), under a lock that every use of the socket takes: these sends,
  the IOPub thread's own, its handling of XPUB subscriptions, and closing it. A ZeroMQ socket
  may move between threads, never be used by two at once; the lock is the barrier both need.
  A message sent while the queue holds something waits in the queue behind it, so each
  thread's messages keep the order it sent them in: a message goes inline only once whatever
  its thread handed over before has gone out.
- **The rest is run with one wake-up per batch** instead of one per item: messages that had to
  queue, and the other work ipykernel hands the thread (its output streams' flushes and
  timers), in order, from whichever thread.

The socket's sharing (and a subscription that such a send takes in) is `shared_socket.py`'s.
Once the IOPub thread has stopped (at exit, in a forked child), everything runs on the caller's
thread as ipykernel does, without the lock.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from viceroy.kernel.shared_socket import SharedSocket

_NEEDS = ("_events", "_event_puller", "_really_send", "io_loop", "thread", "socket", "close", "closed")


def hand_iopub_over(io_thread: Any) -> bool:
    """Install both changes on `io_thread`, an `ipykernel.iostream.IOPubThread` that is
    running (see the module's notes). An IOPub thread without the parts this relies on (an
    ipykernel not yet known here) is left as it is, with a warning: False."""
    missing = [name for name in _NEEDS if not hasattr(io_thread, name)]
    if missing:
        print(f"viceroy: this ipykernel's IOPub thread has no {', '.join(missing)}: its messages "
              "go through it as in a stock kernel", file=sys.__stderr__)
        return False
    try:
        _HandOff(io_thread)  # changes nothing unless the thread took the locked handler
    except RuntimeError as e:
        print(f"viceroy: {e}: IOPub messages go through its thread as in a stock kernel", file=sys.__stderr__)
        return False
    return True


class _HandOff:
    def __init__(self, io_thread: Any) -> None:
        self.io_thread = io_thread
        self.events = io_thread._events
        self.queue_lock = threading.Lock()
        self.woken = False  # a drain is scheduled or running, and will see what is queued now
        stream = getattr(io_thread, "_xpub_stream", None)  # None: a PUB socket, nothing reads it
        self.shared = SharedSocket(io_thread.socket, io_thread.io_loop, stream)
        close = io_thread.close

        def locked_close() -> None:
            with self.shared.lock:
                close()

        io_thread.close = locked_close
        io_thread.schedule = self.schedule
        io_thread.send_multipart = self.send_multipart
        # Anything handed over the old way before this ran still arrives through its ZeroMQ pipe.
        io_thread._event_puller.on_recv(lambda _msg: self.drain())

    def schedule(self, f: Any) -> None:
        """Run `f` on the IOPub thread, after everything handed over before it."""
        if not self.io_thread.thread.is_alive():
            f()
            return
        with self.queue_lock:
            self.events.append(f)
            wake, self.woken = not self.woken, True
        if wake:
            self.io_thread.io_loop.add_callback(self.drain)  # thread-safe: one write to a pipe

    def send_multipart(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        """Send `msg` now on this thread if nothing waits to go before it, else queue it."""
        if not self.io_thread.thread.is_alive():
            self.io_thread._really_send(msg, *args, **kwargs)
            return
        with self.queue_lock:
            inline = not self.woken and not self.events
        if inline:
            self._send(msg, args, kwargs)
        else:
            self.schedule(lambda: self._send(msg, args, kwargs))

    def drain(self) -> None:
        while True:
            with self.queue_lock:
                if not self.events:
                    self.woken = False
                    return
                f = self.events.popleft()
            try:
                f()
            except Exception as e:  # as ipykernel's loop would log it, and go on with the rest
                print(f"viceroy: sending on IOPub failed: {e!r}", file=sys.__stderr__)

    def _send(self, msg: Any, args: tuple, kwargs: dict) -> None:
        send = self.io_thread._really_send
        self.shared.send(lambda: send(msg, *args, **kwargs))
