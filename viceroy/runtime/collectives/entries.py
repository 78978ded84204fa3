"""The communicators this rank holds, one per (backend, group, device), and giving one up.

A communicator given up (by this rank or, as its store records say, by a peer) is aborted and
forgotten: the next collective over its group builds a fresh one (see `building`). Giving up
writes why first, so the peers that see their connections cut can name the root cause.
"""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass

from viceroy.runtime import call_peers
from viceroy.runtime.collectives.backend import Communicator
from viceroy.runtime.collectives.records import Record, read_records, write_record
from viceroy.runtime.collectives.store import rendezvous, store_on_rank0
from viceroy.runtime.collectives.waiting import interrupts_held
from viceroy.runtime.context import context

# Read when a group is built, not at import: ranks import this module in the template process
# they are forked from, before the mesh's environment (Mesh.local(env=...)) is theirs.
_timeout: float | None = None


def set_timeout(seconds: float) -> None:
    """How long a collective (or building its communicator) may wait for a peer before it
    fails; default 600 s, or ``VICEROY_COLLECTIVE_TIMEOUT``. Applies to groups built later."""
    global _timeout
    _timeout = float(seconds)


def current_timeout() -> float:
    if _timeout is not None:
        return _timeout
    value = os.environ.get("VICEROY_COLLECTIVE_TIMEOUT", "600")
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds < math.inf:  # "10s"; 0 or less, which would give every group up at once
        raise ValueError(f"VICEROY_COLLECTIVE_TIMEOUT={value!r} (in the ranks' environment) is no number of "
                         "seconds > 0: set it to e.g. 600 (the default)")
    return seconds


Key = tuple[str, tuple[int, ...], int | None]


@dataclass
class Entry:
    comm: Communicator | None  # None while it is being built
    key: Key
    base: str  # the group's store prefix, incarnation included
    incarnation: str
    gen: int
    ops: int = 0  # operations started on this communicator (every member counts the same)
    last_sig: str | None = None  # what this member passed to the last one (see agreement)
    checked: bool = False  # operations are checked first (see checking); every member alike

    @property
    def prefix(self) -> str:
        return f"{self.base}/g{self.gen}"


cache: dict[Key, Entry] = {}
lock = threading.Lock()
joined: set[str] = set()  # the store prefixes of every generation this process joined


def abort_all() -> int:
    """Cut every communicator of this rank (any thread; the runtime may call it on interrupt).
    Operations in flight here and on the peers fail at once; the next use rebuilds."""
    with lock:
        entries = list(cache.values())
    for e in entries:
        if e.comm is not None:
            e.comm.abort()
    return len(entries)


def healthy(entry: Entry) -> bool:
    assert entry.comm is not None
    local = entry.comm.healthy()
    if local is not None:
        return local
    live = rendezvous.current()  # the backend cannot tell by itself: ask the store
    if live is None or live[1] != entry.incarnation:
        return False
    try:
        return not live[0].check([f"{entry.prefix}/aborts"])
    except RuntimeError:
        return False


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


# --- giving up ---------------------------------------------------------------------------------


def forget(entry: Entry) -> None:
    if entry.comm is not None:
        entry.comm.abort()
    with lock:
        if cache.get(entry.key) is entry:
            del cache[entry.key]


def give_up_all(reason: str) -> None:
    """Give up every communicator of this rank, for `reason` (see `give_up`)."""
    with lock:
        entries = list(cache.values())
    for e in entries:
        give_up(e, reason)


def give_up(entry: Entry, reason: str, lost: int | None = None, stale: bool = False,
            shared: bool = False) -> list[Record] | None:
    """Record why this rank gives the group up, then abort the communicator (in that order: a
    peer that sees our connections cut finds our record) and forget it. A build given up also
    moves the generation on. Returns the generation's records, or None without a store.

    Interrupts are held meanwhile (`waiting.interrupts_held`), so the bookkeeping is never cut
    short."""
    records: list[Record] | None = None
    with interrupts_held():
        try:
            # Losing rank 0 usually means losing the store it hosts: asking a dead store makes
            # torch print a C++ stack trace, and a cut-off one answers nothing, so do not.
            store_lost = store_on_rank0() and (lost == 0 or call_peers.died([0]))
            live = None if store_lost else rendezvous.current()
            if live is not None and live[1] == entry.incarnation:
                store = live[0]
                write_record(store, entry.prefix, Record(context().rank, reason, time.time(), lost, stale, shared))
                if entry.comm is None:
                    store.compare_set(f"{entry.base}/gen", str(entry.gen), str(entry.gen + 1))
                records = read_records(store, entry.prefix)
        except Exception:
            rendezvous.reset()  # the server is gone (with rank 0): reconnect on next use
        finally:
            forget(entry)
    return records
