"""Local links: the work path between the controller and ranks on its own host (direct mode),
and what ranks send their agent (relayed mode), over Unix stream sockets read and written by
the threads that use them.

ZeroMQ moves every message through an IO thread of its own at each end, so a call to four local
ranks and their answers wake a dozen threads across five processes; on a small machine each
wake-up costs tens of microseconds, more after idling. On a link the controller's calling thread
writes the call straight into each rank's socket, the rank's main thread reads it there, and the
rank writes everything it sends (answers, output, replies) back on the same socket, in order,
read by the controller's IO thread. Control messages (cancel, stacks, actors) stay on ZeroMQ:
the rank's IO thread reads them while its main thread is busy. Where an agent relays (several
hosts), each rank sends on a link to its agent (calls still come on ZeroMQ). Either way, a
message a rank has sent is in the kernel's socket buffer once `send` returns, not in a ZeroMQ
queue of the process, so it arrives even if the rank is killed right after (a flushed line's
last words).

A message is a list of frames, sent as ``[u64 size][u32 count]`` then each frame's length
(``u64``) then the frames. Signing and checking them is the callers' business, as on ZeroMQ
(`viceroy.runtime.wire`). The socket lives in the controller's private directory (mode 0700).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import zmq

_HEAD = struct.Struct("<QI")
_MAX_MESSAGE = 1 << 40  # bytes: anything claiming more is not a message of ours
_MAX_IOV = 512  # buffers per sendmsg (the system allows 1024)
_READ = 1 << 18
_JOIN_MAX = 1 << 16  # bytes: a message of bytes frames up to this size is copied into one buffer
_READ_PER_ROUND = 1 << 22  # bytes read from one link per IO round, so others get their turn
_NOSIGNAL = getattr(socket, "MSG_NOSIGNAL", 0)
_POLLIN, _POLLOUT = int(zmq.POLLIN), int(zmq.POLLOUT)
CONNECT_WAIT_S = 1.0  # how long a send waits for a rank's link (ZeroMQ's routing waits as long)


class BrokenLink(Exception):
    """The bytes on a link do not parse as messages."""


def encode(frames: Sequence[Any]) -> deque[memoryview]:
    """The buffers that carry `frames` (no copies; empty frames need none)."""
    views = []
    for f in frames:
        mv = memoryview(f)
        if mv.ndim != 1 or mv.format != "B":
            mv = mv.cast("B")
        views.append(mv)
    return deque([memoryview(header([mv.nbytes for mv in views])), *(mv for mv in views if mv.nbytes)])


def header(lens: Sequence[int]) -> bytes:
    """What goes before frames of these lengths: the size of the rest, the count, each length."""
    n = len(lens)
    return _HEAD.pack(8 * n + sum(lens), n) + struct.pack(f"<{n}Q", *lens)


def write(sock: socket.socket, bufs: deque[memoryview]) -> None:
    """Write from the front of `bufs` until all is out or, on a non-blocking socket, the socket is
    full; what was written leaves `bufs` (a buffer written in part is replaced by its rest)."""
    while bufs:
        try:
            n = sock.sendmsg(list(itertools.islice(bufs, _MAX_IOV)), (), _NOSIGNAL)
        except BlockingIOError:
            return
        while n:
            first = bufs[0]
            if n >= first.nbytes:
                n -= first.nbytes
                bufs.popleft()
            else:
                bufs[0] = first[n:]
                n = 0


class Reader:
    """Cuts a byte stream into messages. Each message gets memory of its own, so its frames
    (memoryviews of it) stay valid, and writable, for as long as they are used."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, chunk: bytes) -> list[list[memoryview]]:
        buf = self._buf
        buf += chunk
        out: list[list[memoryview]] = []
        start = 0
        while len(buf) - start >= _HEAD.size:
            size, n = _HEAD.unpack_from(buf, start)
            if 8 * n > size or size > _MAX_MESSAGE:
                raise BrokenLink(f"a message of {size} bytes with {n} frames is not one of ours")
            end = start + _HEAD.size + size
            if len(buf) < end:
                break
            msg = memoryview(buf[start + _HEAD.size : end])
            lens = struct.unpack_from(f"<{n}Q", msg)
            if 8 * n + sum(lens) != size:
                raise BrokenLink("frame lengths do not add up to the message's size")
            frames, offset = [], 8 * n
            for length in lens:
                frames.append(msg[offset : offset + length])
                offset += length
            out.append(frames)
            start = end
        if start:
            del buf[:start]
        return out


_OTHER, _BATCH = getattr(os, "SCHED_OTHER", None), getattr(os, "SCHED_BATCH", None)
if _OTHER is None:  # not Linux: no switch
    _BATCH = None
_PARAM = os.sched_param(0) if _BATCH is not None else None


class _waiting_in_batch:  # used as a function: `with _waiting_in_batch():`
    """The calling thread is SCHED_BATCH inside, if it is SCHED_OTHER (a policy the user chose
    is left alone). Linux only; elsewhere nothing changes. A class, not a generator-based
    context manager: it runs around every receive, where contextlib's machinery (with a
    `suppress` at each end) cost a dozen Python calls."""

    __slots__ = ("_switched",)

    def __enter__(self) -> None:
        self._switched = False
        if _BATCH is not None:
            try:
                if os.sched_getscheduler(0) == _OTHER:
                    os.sched_setscheduler(0, _BATCH, _PARAM)  # type: ignore[arg-type]
                    self._switched = True
            except OSError:
                pass

    def __exit__(self, *exc: object) -> None:
        if self._switched:
            try:
                os.sched_setscheduler(0, _OTHER, _PARAM)  # type: ignore[arg-type]
            except OSError:
                pass


class RankLink:
    """A rank's end: the main thread reads work with `recv`; every thread sends with `send`,
    one at a time (the rank holds its send lock), in blocking writes."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self._reader = Reader()
        self._ready: deque[list[memoryview]] = deque()

    def send(self, frames: Sequence[Any]) -> None:
        """Raises OSError when the controller is gone."""
        size = 0
        for f in frames:
            if type(f) is not bytes:
                break
            size += len(f)
        else:  # a small message of bytes (an answer, a line of output): one buffer, one write
            if size <= _JOIN_MAX:
                self.sock.sendall(b"".join([header([len(f) for f in frames]), *frames]), _NOSIGNAL)
                return
        write(self.sock, encode(frames))

    def recv(self, until_ready: Callable[[int], None] | None = None) -> list[memoryview] | None:
        """The next message; None when the controller closed the link (or is gone).
        `until_ready(fd)`, if given, is called to wait until the socket has something to read
        (`viceroy.runtime.signal_wakeup`).

        While it waits, the thread is SCHED_BATCH (if it was SCHED_OTHER): a call's message
        then wakes it without preempting the controller, which goes on to send the same call
        to the next ranks instead of waiting for this one to finish first (on a machine with
        fewer cores than ranks, a 4-rank call took twice as long). It is SCHED_OTHER again,
        as before, before the call runs."""
        if self._ready:
            return self._ready.popleft()
        with _waiting_in_batch():
            while not self._ready:
                if until_ready is not None:
                    until_ready(self.sock.fileno())
                try:
                    chunk = self.sock.recv(_READ)
                except ConnectionError:
                    return None
                if not chunk:
                    return None
                self._ready.extend(self._reader.feed(chunk))
        return self._ready.popleft()


class Link:
    """The controller's end of one rank's link."""

    __slots__ = ("closed", "fd", "lock", "pending", "rank", "reader", "sock")

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.fd = sock.fileno()
        self.reader = Reader()
        self.lock = threading.Lock()  # senders; the IO thread flushing what they left
        self.pending: deque[memoryview] = deque()
        self.rank: int | None = None
        self.closed = False


class LinkServer:
    """The controller's links. Senders (any thread) write what the socket takes and leave the
    rest for the IO thread, which owns the poller: it accepts, reads, flushes and closes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(path)
        self._listener.listen(128)
        self._listener.setblocking(False)
        self.fd = self._listener.fileno()
        self._links: dict[int, Link] = {}  # by fd; IO thread only
        self._cond = threading.Condition()
        self._by_rank: dict[int, Link] = {}
        self._flush: set[Link] = set()  # links with output left over, not yet watched for it

    # --- any thread ----------------------------------------------------------------------------

    def send(self, rank: int, frames: Sequence[Any], deadline: float | None = None) -> bool:
        """Send `frames` to `rank`; True when output was left for the IO thread to flush (then
        wake it). A rank with no link yet (just started) is waited for until `deadline`
        (monotonic; default CONNECT_WAIT_S from now); one whose link is gone gets nothing:
        its death is reported by its agent, as on ZeroMQ."""
        return self.send_many((rank,), frames, deadline)

    def send_many(self, ranks: Sequence[int], frames: Sequence[Any], deadline: float | None = None) -> bool:
        """`send` to each of `ranks` in turn: the frames are encoded once, and the writes follow
        one another closely (ranks that answer the first ones meanwhile find the IO thread
        idle, not competing with the sends for the interpreter)."""
        encoded = encode(frames)
        left = False
        for rank in ranks:
            link = self._by_rank.get(rank)  # a dict read (atomic); a miss waits under the lock
            if link is None:
                link = self._await_link(rank, deadline)
                if link is None:
                    continue
            left |= self._write(link, deque(encoded))
        return left

    def _await_link(self, rank: int, deadline: float | None) -> Link | None:
        with self._cond:
            link = self._by_rank.get(rank)
            if link is None:
                wait = (deadline if deadline is not None else time.monotonic() + CONNECT_WAIT_S) - time.monotonic()
                self._cond.wait_for(lambda: rank in self._by_rank, max(0.0, wait))
                link = self._by_rank.get(rank)
        return link

    def _write(self, link: Link, bufs: deque[memoryview]) -> bool:
        with link.lock:
            if link.closed:
                return False
            if link.pending:  # queued behind what is waiting already (watched already)
                link.pending.extend(bufs)
                return False
            try:
                write(link.sock, bufs)
            except OSError:  # the rank is gone; the IO thread sees its end of file
                return False
            if not bufs:
                return False
            link.pending = bufs
        with self._cond:
            self._flush.add(link)
        return True

    def bind(self, rank: int, link: Link) -> None:
        """`link` is `rank`'s (its hello arrived on it, signed): calls to the rank go there."""
        with self._cond:
            link.rank = rank
            self._by_rank[rank] = link
            self._cond.notify_all()

    # --- the IO thread ---------------------------------------------------------------------

    def watch(self, poller: zmq.Poller) -> None:
        """Before polling: watch links with output left over for room to write."""
        if not self._flush:
            return
        with self._cond:
            flush, self._flush = self._flush, set()
        for link in flush:
            if not link.closed:
                poller.register(link.fd, _POLLIN | _POLLOUT)

    def service(self, ready: dict[Any, int], poller: zmq.Poller) -> Iterator[tuple[list[memoryview], Link]]:
        """After polling: accept, flush and read what `ready` says is ready; yields each
        message with the link it came on."""
        for fd, events in ready.items():
            if fd == self.fd:
                self._accept(poller)
                continue
            link = self._links.get(fd) if isinstance(fd, int) else None
            if link is None:
                continue
            if events & _POLLOUT:
                self._flush_some(link, poller)
            if events & ~_POLLOUT:
                yield from self._read(link, poller)

    def read_all(self, poller: zmq.Poller) -> Iterator[tuple[list[memoryview], Link]]:
        """Everything every link holds now, without waiting (before a rank's death is reported,
        what it sent just before dying goes first)."""
        yield from self.service(dict.fromkeys(list(self._links), _POLLIN), poller)

    def close(self) -> None:
        for link in list(self._links.values()):
            self._close(link, None)
        self._listener.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)

    def _accept(self, poller: zmq.Poller) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of descriptors, say: the rank's connect fails, it exits
                return
            link = Link(sock)
            self._links[link.fd] = link
            poller.register(link.fd, _POLLIN)

    def _flush_some(self, link: Link, poller: zmq.Poller) -> None:
        with link.lock:
            try:
                write(link.sock, link.pending)
            except OSError:
                link.pending.clear()
            if not link.pending and not link.closed:
                poller.register(link.fd, _POLLIN)

    def _read(self, link: Link, poller: zmq.Poller) -> Iterator[tuple[list[memoryview], Link]]:
        budget = _READ_PER_ROUND
        while budget > 0:
            try:
                chunk = link.sock.recv(_READ)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                chunk = b""
            if not chunk:  # the rank exited (its agent says how)
                self._close(link, poller)
                return
            budget -= len(chunk)
            try:
                messages = link.reader.feed(chunk)
            except BrokenLink:
                self._close(link, poller)
                return
            for frames in messages:
                yield frames, link
            if len(chunk) < _READ:
                # The socket held less than asked: it is empty now. What comes next wakes the
                # poll again (it is level-triggered), so a read that would only say "nothing
                # more" (a system call, and the interpreter handed over twice) is not made.
                return

    def _close(self, link: Link, poller: zmq.Poller | None) -> None:
        with link.lock:
            link.closed = True
            link.pending.clear()
        with self._cond:
            if link.rank is not None and self._by_rank.get(link.rank) is link:
                del self._by_rank[link.rank]
        self._links.pop(link.fd, None)
        if poller is not None:
            with contextlib.suppress(KeyError, ValueError):
                poller.unregister(link.fd)
        link.sock.close()
