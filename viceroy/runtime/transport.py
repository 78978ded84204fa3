"""The controller's sockets: a ROUTER that sends to agents (or, on one local host, straight to
ranks) and a PULL that receives from them; on its own host, the ranks' local links
(`viceroy.runtime.links`); plus a wake-up pipe for the IO thread.

Sending happens on callers' threads under a lock; receiving only on the IO thread. A message
goes out whole: on the main thread an interrupt (the kernel's stop button) that lands while
one is being sent is raised once it is out (see `_WholeMessages`).
"""

from __future__ import annotations

import _signal
import contextlib
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import zmq

from viceroy.runtime import multipart
from viceroy.runtime.links import CONNECT_WAIT_S, Link, LinkServer

_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)  # plain ints: no enum built per check


_SIGINT = int(signal.SIGINT)


class _WholeMessages:
    """Hold SIGINT back, on the main thread, while a message is being sent: pyzmq sends a
    multipart message frame by frame, and a KeyboardInterrupt between two frames would leave
    half of it in the socket, to garble whatever is sent next. An interrupt that comes meanwhile
    is delivered (to the handler that was there) as soon as the block ends. Costs two calls
    of the C-level _signal.signal (~0.6 us; signal.signal converts to and from enums, ~8 us)
    on the main thread, nothing elsewhere."""

    def __init__(self) -> None:
        self._main = threading.main_thread().ident
        self._previous: Any = None
        self._came: Any = None  # the frame an interrupt came in, if one did
        self._depth = 0

    def _hold(self, signum: int, frame: Any) -> None:
        self._came = frame or True

    def __enter__(self) -> None:
        if threading.get_ident() != self._main:
            return
        if self._depth == 0:
            self._came = None
            self._previous = _signal.getsignal(_SIGINT)
            if self._previous is not None:  # None: a handler set outside Python, left alone
                _signal.signal(_SIGINT, self._hold)
        self._depth += 1

    def __exit__(self, *exc: object) -> None:
        if threading.get_ident() != self._main:
            return
        self._depth -= 1
        if self._depth:
            return
        previous, came = self._previous, self._came
        self._previous = self._came = None  # keep no frame alive
        if previous is None:
            return
        _signal.signal(_SIGINT, previous)
        if came is not None:
            if callable(previous):
                previous(signal.SIGINT, came if came is not True else None)
            elif previous == signal.SIG_DFL:
                signal.raise_signal(signal.SIGINT)


whole_messages = _WholeMessages()


class ControllerSockets:
    def __init__(self, same_host: bool, interface: str) -> None:
        self._ctx = zmq.Context()
        self._router = self._ctx.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._router.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a restarted rank takes its identity back
        self._router.setsockopt(zmq.LINGER, 0)
        self._router_lock = threading.Lock()
        self._pull = self._ctx.socket(zmq.PULL)
        self._pull.setsockopt(zmq.LINGER, 0)
        self._rundir: str | None = None
        self.links: LinkServer | None = None
        if same_host:
            # Unix sockets in a private directory: faster than loopback TCP, and only this
            # user can connect at all.
            self._rundir = tempfile.mkdtemp(prefix="viceroy-")
            self.address_in, self.address_out = f"ipc://{self._rundir}/in", f"ipc://{self._rundir}/out"
            self._router.bind(self.address_in)
            self._pull.bind(self.address_out)
            self.links = LinkServer(f"{self._rundir}/links")
        else:
            self.address_in = f"tcp://{interface}:{self._router.bind_to_random_port(f'tcp://{interface}')}"
            self.address_out = f"tcp://{interface}:{self._pull.bind_to_random_port(f'tcp://{interface}')}"
        self._wake_r, self._wake_w = os.pipe()
        self._poller = zmq.Poller()
        self._poller.register(self._pull, zmq.POLLIN)
        self._poller.register(self._wake_r, zmq.POLLIN)
        if self.links is not None:
            self._poller.register(self.links.fd, zmq.POLLIN)
        self._ready: dict[Any, int] = {}

    @property
    def address_links(self) -> str | None:
        return self.links.path if self.links is not None else None

    def send_once(self, ident: bytes, frames: list[Any]) -> None:
        """One try, never blocking nor retrying (heartbeats: a lost peer must not stall them)."""
        with contextlib.suppress(zmq.ZMQError), self._router_lock, whole_messages:
            multipart.send(self._router, [ident, *frames], multipart.NOBLOCK)

    def send(self, idents: list[bytes], frames: list[Any]) -> None:
        """One copy of `frames` to each peer. A peer that just started may not have finished
        connecting: retry briefly. One that is gone is skipped (its watcher reports it)."""
        with whole_messages:  # to every peer, or (raising before it starts) to none
            for ident in idents:
                for attempt in range(200):
                    try:
                        with self._router_lock:
                            multipart.send(self._router, [ident, *frames])
                        break
                    except zmq.ZMQError as exc:
                        if exc.errno != zmq.EHOSTUNREACH or attempt == 199:
                            break
                        time.sleep(0.005)

    def send_links(self, ranks: Sequence[int], frames: list[Any]) -> None:
        """One copy of `frames` to each rank, on its local link (ranks not connected yet are
        waited for a second, all together)."""
        assert self.links is not None
        with whole_messages:
            flush = self.links.send_many(ranks, frames, time.monotonic() + CONNECT_WAIT_S)
        if flush:
            self.wake()

    # --- the IO thread -------------------------------------------------------------------------

    def wait(self, timeout: float | None) -> bool:
        """Block until a message or a wake-up (or `timeout` seconds); True if woken."""
        if self.links is not None:
            self.links.watch(self._poller)
        try:
            # At most an hour per wait: poll takes a C int of milliseconds (24 days at most).
            events = dict(self._poller.poll(None if timeout is None else max(0, int(min(timeout, 3600) * 1000) + 1)))
        except zmq.ZMQError:
            return False
        self._ready = events
        if self._wake_r in events:
            with contextlib.suppress(OSError):
                os.read(self._wake_r, 4096)
            return True
        return False

    def received(self, limit: int = 1000) -> Iterator[tuple[list[Any], Link | None]]:
        """Messages already there, without blocking (bounded, so deadlines still get checked),
        each with the local link it came on (None: ZeroMQ)."""
        for _ in range(limit):
            if not self._pull.get(_EVENTS) & _POLLIN:  # type: ignore[operator]
                break
            yield self._pull.recv_multipart(copy=False), None
        if self.links is not None and self._ready:
            ready, self._ready = self._ready, {}
            yield from self.links.service(ready, self._poller)

    def read_links(self) -> Iterator[tuple[list[Any], Link | None]]:
        """What the local links hold now, without waiting (IO thread)."""
        if self.links is not None:
            yield from self.links.read_all(self._poller)

    def wake(self) -> None:
        """Make `wait` return at once (any thread)."""
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def close(self) -> None:
        if self.links is not None:
            self.links.close()
        self._router.close()
        self._pull.close()
        self._ctx.term()
        os.close(self._wake_r)
        os.close(self._wake_w)
        if self._rundir:
            shutil.rmtree(self._rundir, ignore_errors=True)


