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

A send on another thread can take in a new subscriber's request, which then no longer wakes the
IOPub thread's loop (ZeroMQ's descriptor tells of changes, not of what is waiting); so after
each send the socket is asked whether something is waiting, and the thread is told to read it
(the welcome message a client may wait for). Once the IOPub thread has stopped (at exit, in a
forked child), everything runs on the caller's thread as ipykernel does, without the lock.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import zmq


def hand_iopub_over(io_thread: Any) -> None:
    """Install both changes on `io_thread`, an `ipykernel.iostream.IOPubThread` that is
    running (see the module's notes)."""
    _HandOff(io_thread)


class _HandOff:
    def __init__(self, io_thread: Any) -> None:
        self.io_thread = io_thread
        self.events = io_thread._events
        self.queue_lock = threading.Lock()
        self.socket_lock = threading.RLock()  # held by whoever uses the socket
        self.woken = False  # a drain is scheduled or running, and will see what is queued now
        self.stream = getattr(io_thread, "_xpub_stream", None)
        if self.stream is not None:
            self._lock_subscriptions(self.stream)
        close = io_thread.close

        def locked_close() -> None:
            with self.socket_lock:
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
        io_thread = self.io_thread
        with self.socket_lock:
            io_thread._really_send(msg, *args, **kwargs)
            if self.stream is None or io_thread.closed:
                return
            try:
                waiting = io_thread.socket.getsockopt(zmq.EVENTS) & zmq.POLLIN
            except zmq.ZMQError:
                return
        if waiting:
            io_thread.io_loop.add_callback(self._read_subscriptions, io_thread.socket, 0)

    def _lock_subscriptions(self, stream: Any) -> None:
        """Make the XPUB stream's handler (ipykernel's, on the IOPub thread) take the socket's
        lock: it reads the socket's events, takes subscriptions in and sends welcomes. The
        handler is registered with the loop as a bound method, so it is registered again, on
        the IOPub thread (the loop's handlers are that thread's to change); the stream's own
        follow-ups look the handler up on the stream, where the locked one is set."""
        io_thread = self.io_thread
        handle = stream._handle_events
        socket_lock = self.socket_lock

        def locked(fd: Any, events: int) -> None:
            with socket_lock:
                handle(fd, events)

        self._read_subscriptions = locked
        done = threading.Event()

        def swap() -> None:
            try:
                loop = io_thread.io_loop
                loop.remove_handler(io_thread.socket)
                stream._handle_events = locked
                loop.add_handler(io_thread.socket, locked, loop.READ)
            finally:
                done.set()

        io_thread.io_loop.add_callback(swap)
        if not done.wait(10):
            raise RuntimeError("the IOPub thread did not take the XPUB stream's new handler in 10 s")
