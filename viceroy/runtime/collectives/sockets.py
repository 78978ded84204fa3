"""Finding and cutting a communicator's TCP connections.

gloo has no abort (``ProcessGroupGloo.abort()`` is a no-op in torch 2.13): an operation waiting
on a peer that never comes blocks its worker thread until the gloo timeout. Shutting down the
group's sockets does what an abort should: the local operation fails at once ("Connection closed
by peer"), and so does every peer's operation on the same group, so one rank's failure releases
the whole group within milliseconds, exactly as when a process dies.

A group's sockets are the TCP sockets that appeared while it was being built, minus the
rendezvous store's connections.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import socket
from collections.abc import Iterator


def socket_fds() -> dict[int, str]:
    """This process's open sockets: fd -> its ``socket:[inode]`` link (an fd number can be
    reused once closed; the inode tells the same socket from a newer one)."""
    fds: dict[int, str] = {}
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/self/fd/{name}")
            if link.startswith("socket:"):
                fds[int(name)] = link
    return fds


Socket = tuple[int, str]  # (fd, "socket:[inode]")


@contextlib.contextmanager
def _borrowed(fd: int, link: str | None = None) -> Iterator[socket.socket | None]:
    """A socket object over a dup of `fd` (None if it is gone, or no longer the socket `link`
    names); the dup is closed after, the fd stays its owner's."""
    try:
        if link is not None and os.readlink(f"/proc/self/fd/{fd}") != link:
            yield None
            return
        s = socket.socket(fileno=os.dup(fd))
    except OSError:
        yield None
        return
    try:
        yield s
    finally:
        s.close()


def tcp_sockets(fds: dict[int, str], exclude_port: int) -> dict[Socket, tuple[int, bool]]:
    """(fd, inode) -> (local port, listening?), for the TCP sockets among `fds` that do not
    touch `exclude_port` (the store's)."""
    out: dict[Socket, tuple[int, bool]] = {}
    for fd, link in fds.items():
        with _borrowed(fd) as s, contextlib.suppress(OSError):
            if s is None or s.family not in (socket.AF_INET, socket.AF_INET6) or s.type != socket.SOCK_STREAM:
                continue
            local = s.getsockname()[1]
            try:
                remote = s.getpeername()[1]
            except OSError:
                remote = None
            if exclude_port not in (local, remote):
                listening = bool(s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))
                out[(fd, link)] = (local, listening)
    return out


def is_current(sock: Socket) -> bool:
    """Whether the fd still holds that very socket."""
    try:
        return os.readlink(f"/proc/self/fd/{sock[0]}") == sock[1]
    except OSError:
        return False


def cut(sockets: list[Socket]) -> None:
    """Shut down (not close: the owner closes its fds) each of `sockets` still open."""
    for fd, link in sockets:
        # None: closed by its owner, the number perhaps since reused; OSError: already gone,
        # or a listener.
        with _borrowed(fd, link) as s, contextlib.suppress(OSError):
            if s is not None:
                s.shutdown(socket.SHUT_RDWR)


def connection_to(port: int, fds: dict[int, str]) -> Socket | None:
    """The socket among `fds` connected to `port` (a client's connection to a server)."""
    for fd, link in fds.items():
        with _borrowed(fd) as s, contextlib.suppress(OSError, IndexError):
            if s is not None and s.type == socket.SOCK_STREAM and s.getpeername()[1] == port:
                return (fd, link)
    return None


def is_open(sock: Socket) -> bool:
    """False once the peer closed the connection (or the fd is gone)."""
    with _borrowed(*sock) as s:
        if s is None:
            return False
        try:
            return s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
        except BlockingIOError:
            return True  # open, nothing to read
        except OSError:
            return False


_CLOSED = select.EPOLLRDHUP | select.EPOLLHUP | select.EPOLLERR  # the peer's end, or ours, is gone


class Watch:
    """Our own handles on a group's connections (dups of the fds), to tell whether a peer has
    closed its end, even when unread data is still queued: one epoll_wait for all of them,
    asked before every operation (a TCP_INFO query per connection cost 2-3 us each here). An
    epoll set may be waited on from several threads at once (actors' collectives), unlike a
    poll object. (Linux only, as is the rest of this module: /proc/self/fd.)"""

    def __init__(self, conns: list[Socket]) -> None:
        self._socks: list[socket.socket] = []
        for fd, link in conns:
            try:
                if os.readlink(f"/proc/self/fd/{fd}") == link:
                    self._socks.append(socket.socket(fileno=os.dup(fd)))
            except OSError:
                continue
        self._epoll = select.epoll()
        for s in self._socks:
            self._epoll.register(s, _CLOSED)

    def all_established(self) -> bool:
        try:
            return not self._epoll.poll(0)
        except (OSError, ValueError):  # ValueError: closed (a communicator aborted meanwhile)
            return False

    def cut(self) -> None:
        for s in self._socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._epoll.close()
        for s in self._socks:
            s.close()
        self._socks = []


_ADDRESS = re.compile(r"\[[^\]]*\]:(\d+)")


def ports_in(message: str) -> list[int]:
    """Ports named in a gloo error ("Connection closed by peer [127.0.0.1]:8597"). gloo prints
    the port in network byte order, so both readings are returned."""
    out = []
    for m in _ADDRESS.finditer(message):
        p = int(m.group(1))
        out += [p, ((p & 0xFF) << 8) | (p >> 8)]
    return out
