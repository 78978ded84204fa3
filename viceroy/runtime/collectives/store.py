"""The rendezvous store: torch's TCPStore at MASTER_ADDR:MASTER_PORT, the address stock
``init_process_group()`` (env://) uses too.

Rank 0 hosts the server unless ``TORCHELASTIC_USE_AGENT_STORE=True`` says someone else does (as
torchrun's agent does). The server is multi-tenant, so when user code on rank 0 later calls
``init_process_group()`` it shares the same server instead of failing on a taken port.

Each server gets an *incarnation* id: when rank 0 dies and is restarted, its new server starts
empty, and every key we use is prefixed with the incarnation, so nothing stale is read.

A caller never waits on the server in C++: a server cut off (its host's link down, the
connection not closed) leaves an operation waiting until TCP gives up, minutes later, deaf to
interrupts and to the controller's word that rank 0 died. So the connection is asked from a
thread of its own (`asking.Asking`), and callers wait in slices, at most `asking.ASK_S`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import sys
import threading
import time
from datetime import timedelta
from typing import Any

from viceroy.runtime import call_peers
from viceroy.runtime.collectives import sockets
from viceroy.runtime.collectives.asking import Asking
from viceroy.runtime.collectives.errors import CollectiveError
from viceroy.runtime.collectives.waiting import sleep_slice

INCARNATION_KEY = "viceroy/incarnation"


def address() -> tuple[str, int]:
    try:
        return os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    except KeyError as exc:
        raise CollectiveError(
            f"{exc.args[0]} is not set: collectives run on mesh ranks, which get MASTER_ADDR and "
            "MASTER_PORT from the mesh"
        ) from None


def store_on_rank0() -> bool:
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"


def hosts_server() -> bool:
    return os.environ.get("RANK") == "0" and store_on_rank0()


class Rendezvous:
    """This process's connection to the store; reconnects after the server went away."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._store: Asking | None = None
        self._conn: sockets.Socket | None = None
        self._spare: list[Any] = []  # build clients given back, idle: see `client`
        self.incarnation = ""

    def get(self, timeout: float) -> tuple[Asking, str]:
        """(store, incarnation); connects first if needed (again if the server went away).
        Waits interruptibly for the server."""
        with self._lock:
            if self._store is not None and not self._live(self._store):
                self._drop()  # asking a dead server makes torch print a C++ stack trace
            if self._store is None:
                self._spare.clear()  # clients of the server that went away
                raw, self.incarnation = self._connect(timeout)
                self._store = Asking(raw, f"{address()[0]}:{address()[1]}", self._lost)
            return self._store, self.incarnation

    def current(self) -> tuple[Asking, str] | None:
        """(store, incarnation) if connected to a live server, else None; never waits."""
        with self._lock:
            if self._store is None or not self._live(self._store):
                return None
            return self._store, self.incarnation

    def reset(self) -> None:
        """Forget the connection (a store operation failed: the server is gone)."""
        with self._lock:
            self._drop()

    def _live(self, store: Asking) -> bool:
        return not store.lost and (self._conn is None or sockets.is_open(self._conn))

    def _drop(self) -> None:
        if self._store is not None:
            self._store.close()
        self._store = None
        self._spare.clear()

    def _lost(self, store: Asking) -> None:
        """`store` did not answer in time: the next `get` connects afresh."""
        with self._lock:
            if self._store is store:
                self._drop()

    def client(self, timeout: float) -> Any:
        """A client connection of its own, for a thread that may block on it: a TCPStore client
        serialises its operations, so a blocked wait would stall every other user. An idle one
        given back with `give_back` if there is one, else a new one (call `get` first).

        Connecting is slow at random here: torch resolves the peer's address back to a name on
        every connect, on the client and in the server's thread (getnameinfo on the IPv4-mapped
        address, which /etc/hosts does not answer, so it asks DNS), and a DNS query left
        unanswered costs the resolver's 5 s timeout. So a rank connects once, not per group."""
        with self._lock:
            if self._spare:
                return self._spare.pop()
        from torch.distributed import TCPStore

        host, port = address()
        return TCPStore(host, port, None, False, timedelta(seconds=timeout), wait_for_workers=False)

    def give_back(self, client: Any, incarnation: str) -> None:
        """`client` (from `client`) is idle again, with nothing of its own pending: the next
        `client` takes it, unless the server it talks to was replaced since."""
        with self._lock:
            if self._store is not None and incarnation == self.incarnation:
                self._spare.append(client)

    def _connect(self, timeout: float) -> tuple[Any, str]:
        from torch.distributed import TCPStore

        host, port = address()
        deadline = time.monotonic() + timeout
        master = hosts_server()
        if not master:
            _wait_for_server(host, port, deadline)
        before = sockets.socket_fds()
        try:
            store = TCPStore(
                host, port, None, master, timedelta(seconds=timeout),
                wait_for_workers=False, multi_tenant=True,
            )
        except RuntimeError as exc:
            if master and "EADDRINUSE" in str(exc):
                raise CollectiveError(
                    f"MASTER_PORT {port} is taken on rank 0's host ({host}), so the rendezvous store "
                    "cannot listen there; free it, or start the mesh on another port: "
                    "Mesh.local(..., env={'MASTER_PORT': '29533'}) or %mesh up ... --env "
                    "MASTER_PORT=29533 (or $VICEROY_MASTER_PORT for every mesh)"
                ) from None
            raise
        self._conn = sockets.connection_to(port, {fd: ln for fd, ln in sockets.socket_fds().items() if before.get(fd) != ln})
        if master:
            store.compare_set(INCARNATION_KEY, "", secrets.token_hex(4))
        while not store.check([INCARNATION_KEY]):
            if time.monotonic() > deadline:
                raise CollectiveError(f"the rendezvous store at {host}:{port} has no incarnation id")
            sleep_slice(0.01)
        return store, store.get(INCARNATION_KEY).decode()


class StoreGone(CollectiveError):
    """Rank 0 died while this rank waited for the store it was to open."""


def start_early() -> None:
    """On rank 0, when torch is already imported (preloaded): start the server now, in the
    background, so that ranks talking among themselves without rank 0 (a send from rank 1 to
    rank 2, a tensor moved between two views) find it up. A failure, such as a taken port, is
    left for the first collective to report: it tries again, and says what to do."""
    if not hosts_server() or "torch" not in sys.modules or "MASTER_PORT" not in os.environ:
        return

    def start() -> None:
        with contextlib.suppress(Exception):
            rendezvous.get(60.0)

    threading.Thread(target=start, name="viceroy-store", daemon=True).start()


def _wait_for_server(host: str, port: int, deadline: float) -> None:
    """Until the server accepts connections; in Python, so an interrupt gets through (the
    TCPStore constructor retries in C++, deaf to KeyboardInterrupt)."""
    delay = 0.005
    while True:
        try:
            socket.create_connection((host, port), timeout=1.0).close()
            return
        except OSError:
            call_peers.check_cancelled()  # an actor's endpoint, interrupted
            if store_on_rank0() and call_peers.died([0]):  # the controller's word: it never comes
                raise StoreGone("rank 0 died, and the rendezvous store with it (it hosts it)") from None
            if time.monotonic() > deadline:
                raise CollectiveError(
                    f"the rendezvous store at {host}:{port} did not come up: it runs on rank 0, "
                    "from its start when torch is preloaded, else once rank 0 uses a collective or "
                    "torch.distributed; is rank 0 alive, and part of this call if torch is not preloaded?"
                ) from None
            sleep_slice(delay)
            delay = min(delay * 2, 0.1)


rendezvous = Rendezvous()
