"""Communicators per (backend, group, device): built lazily, cached, aborted on failure and
rebuilt on next use.

Agreement without a coordinator, through the rendezvous store. For each group the store holds
the number of the next *generation* to build. Members build the generation they read; once
built (which needs every member to have read it), the number moves on, so a later rebuild never
meets stale keys. A member that gives a generation up writes why under it, so its peers can
name the root cause; a build given up moves the number on too, so the members still waiting for
it stop.

A member whose peers gave the group up while it was not looking (it was not in the collective
when they were interrupted) finds out *before* its next operation, without a round trip: its
connections to them are closed (gloo), or the store says so (nccl). It then rebuilds, and the
operation runs on the fresh communicator; nothing is retried after data has moved.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from viceroy.runtime import call_peers
from viceroy.runtime.collectives.agreement import Agreement
from viceroy.runtime.collectives.backend import Backend, Communicator, Pending
from viceroy.runtime.collectives.errors import CollectiveError
from viceroy.runtime.collectives.groups import Group
from viceroy.runtime.collectives.records import Record, read_records, root_cause, write_record
from viceroy.runtime.collectives.store import rendezvous, store_on_rank0
from viceroy.runtime.collectives.waiting import SLICE_S, interrupts_held, uninterrupted
from viceroy.runtime.context import context
from viceroy.runtime.shape import format_rank_set

# Read when a group is built, not at import: ranks import this module in the template process
# they are forked from, before the mesh's environment (Mesh.local(env=...)) is theirs.
_timeout: float | None = None
NOTE_AFTER_S = 10.0  # say who is missing when a group takes this long to form


def set_timeout(seconds: float) -> None:
    """How long a collective (or building its communicator) may wait for a peer before it
    fails; default 600 s, or ``VICEROY_COLLECTIVE_TIMEOUT``. Applies to groups built later."""
    global _timeout
    _timeout = float(seconds)


def _current_timeout() -> float:
    if _timeout is not None:
        return _timeout
    return float(os.environ.get("VICEROY_COLLECTIVE_TIMEOUT", "600"))


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

    @property
    def prefix(self) -> str:
        return f"{self.base}/g{self.gen}"


_entries: dict[Key, Entry] = {}
_lock = threading.Lock()
_joined: set[str] = set()  # the store prefixes of every generation this process joined


def abort_all() -> int:
    """Cut every communicator of this rank (any thread; the runtime may call it on interrupt).
    Operations in flight here and on the peers fail at once; the next use rebuilds."""
    with _lock:
        entries = list(_entries.values())
    for e in entries:
        if e.comm is not None:
            e.comm.abort()
    return len(entries)


def run(what: str, backend: Backend, group: Group, device: int | None,
        start: Callable[[Communicator], Pending], sig: str | None = None) -> None:
    """Run one operation on `group`, building its communicator if needed. On failure the
    communicator is aborted everywhere and a CollectiveError names the root cause.

    `sig` says what every member must agree on (the operation, the tensor's dtype and shape):
    an operation still waiting after `agreement.CHECK_AFTER_S` compares it with the other members',
    and a mismatch (which backends do not notice: they wait for bytes that never come) ends it
    everywhere, naming each rank's."""
    me = context().rank
    call_peers.started(group.name, sig)
    entry = _get(what, backend, group, device)
    if not _healthy(entry):
        _forget(entry)  # the peers gave it up while we were elsewhere
        entry = _get(what, backend, group, device)
    comm = entry.comm
    assert comm is not None
    started = False
    op, entry.ops = entry.ops, entry.ops + 1
    previous, entry.last_sig = entry.last_sig, sig
    try:
        pending = start(comm)
        started = True
        check = Agreement(entry.prefix, op, entry.incarnation, sig, previous, group.ranks) if sig is not None else None
        while not pending.wait(SLICE_S):
            call_peers.check_cancelled()  # an actor's endpoint, interrupted (no signal reaches its thread)
            if gone := call_peers.skipped(group.ranks):
                raise _Skipped(gone)
            if check is not None and (mismatch := check.mismatch()):
                raise _Mismatch(mismatch)
    except _Skipped as exc:
        raise _without(entry, what, group, exc.ranks) from None
    except _Mismatch as exc:
        reason = f"the ranks passed different tensors or operations ({exc.args[0]}); every member must make the same call"
        _give_up(entry, reason, shared=True)  # aborted: the members waiting with us stop too
        raise CollectiveError(f"{what} over {group.label}: {reason}") from None
    except KeyboardInterrupt:
        uninterrupted(lambda: _give_up(entry, f"rank {me} was interrupted"))
        raise
    except Exception as exc:
        if not backend.is_failure(exc) or not (started or getattr(exc, "broken", False)):
            raise  # a usage error, raised before anything was sent
        if gone := call_peers.skipped(group.ranks):  # a member stopped first, on the same word
            raise _without(entry, what, group, gone) from None
        index = comm.lost_peer(exc)
        lost = None if index is None else group.ranks[index]
        reason = (f"rank {me} lost its connection to rank {lost}" if lost is not None
                  else f"rank {me}: {_first_line(exc)}")
        cause = root_cause(_give_up(entry, reason, lost) or [], lost, reason)
        raise CollectiveError(
            f"{what} over {group.label} failed: {cause}. The communicator was aborted; the "
            "next collective over this group builds a fresh one."
        ) from None


class _Mismatch(Exception):
    pass


def _healthy(entry: Entry) -> bool:
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


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


# --- building ----------------------------------------------------------------------------------


class _StoreLost(Exception):
    pass


def _group_failed(what: str, group: Group, cause: str) -> CollectiveError:
    """The group could not form, for a cause every member shares (a rank that never came, one
    that left the call): members that find it recorded raise it about their own collective, so
    the ranks that waited get one message, grouped as one. The cause rides along as
    ``_shared_cause`` for the record this rank leaves."""
    err = CollectiveError(f"{what} over {group.label}: {cause}")
    err._shared_cause = cause  # type: ignore[attr-defined]
    return err


class _Skipped(Exception):
    def __init__(self, ranks: list[int]) -> None:
        self.ranks = ranks


def _without(entry: Entry, what: str, group: Group, ranks: list[int]) -> CollectiveError:
    """Give the group up because `ranks` finished the call without joining this collective, or
    died; the error to raise. No "rank {me}" in it: the ranks that waited get one message,
    grouped as one."""
    reason = f"{call_peers.gone(ranks)}, while the others waited in it"
    _give_up(entry, reason)  # the communicator is aborted: members waiting with us stop too
    return CollectiveError(f"{what} over {group.label}: {reason}.{_order_hint(ranks)}")


def _order_hint(ranks: list[int]) -> str:
    """Advice where some of `ranks` left without joining (none where they all died)."""
    return "" if call_peers.died(ranks) == ranks else " Every rank of a group must call its collectives, in the same order."


class _Stale(Exception):
    """The generation being built was left as stale by a member (see `_build`)."""


def _get(what: str, backend: Backend, group: Group, device: int | None) -> Entry:
    key = (backend.name, group.ranks, device)
    entry = _entries.get(key)
    if entry is not None:
        return entry
    reconnected = False
    while True:  # each stale attempt is left once by each member, so this ends
        try:
            built = _build(what, backend, group, device, key)
            break
        except _StoreLost:
            if reconnected:
                raise
            reconnected = True
            rendezvous.reset()  # rank 0 (the store's host) was restarted: connect to the new one
        except _Stale:
            pass  # a member left a stale attempt: everyone moves to the next generation
    with _lock:
        _entries[key] = built
    return built


@contextlib.contextmanager
def _store_ops() -> Iterator[None]:
    try:
        yield
    except (KeyboardInterrupt, CollectiveError):
        raise
    except RuntimeError as exc:  # DistNetworkError, DistStoreError: the server is gone
        raise _StoreLost(str(exc)) from exc


class _Helper:
    """Builds a communicator on a thread (the build blocks in C++ until every member came),
    while the main thread waits in slices. An abandoned build aborts what it gets."""

    def __init__(self, build: Callable[[], Communicator]) -> None:
        self.comm: Communicator | None = None
        self.error: BaseException | None = None
        self._abandoned = False
        self._lock = threading.Lock()
        self._build = build
        self.thread = threading.Thread(target=self._run, name="viceroy-collective-connect", daemon=True)

    def _run(self) -> None:
        try:
            comm = self._build()
        except BaseException as exc:
            self.error = exc
            return
        with self._lock:
            if self._abandoned:
                comm.abort()
            else:
                self.comm = comm

    def abandon(self) -> None:
        with self._lock:
            self._abandoned = True
            if self.comm is not None:
                self.comm.abort()


def _build(what: str, backend: Backend, group: Group, device: int | None, key: Key) -> Entry:
    from torch.distributed import PrefixStore

    from viceroy.runtime.collectives.stock import install

    install()  # from now on torch's own gloo groups are abortable too

    me = context().rank
    index, timeout = group.index(me), _current_timeout()
    with _store_ops():
        store, incarnation = rendezvous.get(timeout)
        base = f"viceroy/{incarnation}/{backend.name}/{group.name}"
        if device is not None:
            base += f"/dev{device}"
        gen = int(store.add(f"{base}/gen", 0))
        while f"{base}/g{gen}" in _joined:
            # A generation this process joined before and did not see through (its give-up
            # was cut short): leave it, so peers that join it stop, and build the next one.
            _give_up(Entry(None, key, base, incarnation, gen),
                     f"rank {me} left a stale attempt to form the group", stale=True)
            gen = int(store.add(f"{base}/gen", 0))
        entry = Entry(None, key, base, incarnation, gen)
        _joined.add(entry.prefix)
        store.set(f"{entry.prefix}/here/{index}", "1")

    def connect() -> Communicator:
        client = rendezvous.client(timeout)
        store = PrefixStore(f"{entry.prefix}/{backend.name}", client)
        return backend.connect(store, index, group.size, device, timeout)

    # From here on this rank is a member of generation `gen`: however it leaves (an interrupt
    # may land anywhere, even inside Thread.start), it gives the generation up, so no member
    # waits for it and it never joins the same generation twice with a second helper.
    helper = _Helper(connect)
    try:
        helper.thread.start()
        _wait_for_members(what, group, helper, store, entry, timeout)
    except BaseException as exc:
        stale = isinstance(exc, _Stale)  # then leave quietly too: everyone moves on
        why, shared = _why_left(exc, me), hasattr(exc, "_shared_cause")

        def leave() -> None:
            helper.abandon()
            _give_up(entry, why, stale=stale, shared=shared)

        uninterrupted(leave)
        raise
    if helper.error is not None or helper.comm is None:
        cause = _first_line(helper.error) if helper.error else "no communicator"
        with contextlib.suppress(RuntimeError):  # the backend timed out waiting: say for whom
            missing = [r for i, r in enumerate(group.ranks) if not store.check([f"{entry.prefix}/here/{i}"])]
            if missing:
                cause = f"ranks {format_rank_set(missing)} did not join within {timeout:.0f} s (are they running this code?)"
        _give_up(entry, f"rank {me} could not build its {backend.name} communicator: {cause}")
        raise CollectiveError(f"{what} over {group.label}: {cause}") from None
    entry.comm = helper.comm
    with _store_ops():  # built: every member has read `gen`, the next build gets a fresh one
        store.compare_set(f"{base}/gen", str(gen), str(gen + 1))
    return entry


def _why_left(exc: BaseException, me: int) -> str:
    """Why this rank left a group that was forming, for its peers' messages."""
    if isinstance(exc, KeyboardInterrupt):
        return f"rank {me} was interrupted while the group was forming"
    if shared := getattr(exc, "_shared_cause", None):
        return str(shared)
    if isinstance(exc, CollectiveError):
        return str(exc)
    if isinstance(exc, _Stale):
        return f"rank {me} moved on from a stale attempt"
    return f"rank {me} failed while the group was forming: {_first_line(exc)}"


def _wait_for_members(what: str, group: Group, helper: _Helper, store: Any, entry: Entry,
                      timeout: float) -> None:
    began = time.monotonic()
    noted = False
    next_check = began + 0.2
    while helper.thread.is_alive():
        helper.thread.join(SLICE_S)
        call_peers.check_cancelled()
        now = time.monotonic()
        if not helper.thread.is_alive() or now < next_check:
            continue
        next_check = now + 0.2
        with _store_ops():
            records = read_records(store, entry.prefix)
            if records and all(r.stale for r in records):
                raise _Stale
            if records:  # a member gave this build up: why, in its words or the group's
                first = records[0]
                raise _group_failed(what, group, first.reason if first.shared else f"the group could not form: {first.reason}")
            missing = [r for i, r in enumerate(group.ranks) if not store.check([f"{entry.prefix}/here/{i}"])]
        if gone := call_peers.skipped(missing):
            raise _group_failed(what, group, f"{call_peers.gone(gone)}, while the others waited for the group "
                                            f"to form.{_order_hint(gone)}")
        if now - began > timeout:
            raise _group_failed(what, group, f"ranks {format_rank_set(missing)} did not join within "
                                            f"{timeout:.0f} s (are they running this code?)")
        if not noted and now - began > NOTE_AFTER_S and missing:
            noted = True
            print(f"viceroy: rank {context().rank}: {what} over {group.label} is waiting for "
                  f"ranks {format_rank_set(missing)} to join", file=sys.stderr, flush=True)


# --- giving up ---------------------------------------------------------------------------------


def _forget(entry: Entry) -> None:
    if entry.comm is not None:
        entry.comm.abort()
    with _lock:
        if _entries.get(entry.key) is entry:
            del _entries[entry.key]


def _give_up(entry: Entry, reason: str, lost: int | None = None, stale: bool = False,
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
            # torch print a C++ stack trace, so do not.
            live = None if lost == 0 and store_on_rank0() else rendezvous.current()
            if live is not None and live[1] == entry.incarnation:
                store = live[0]
                write_record(store, entry.prefix, Record(context().rank, reason, time.time(), lost, stale, shared))
                if entry.comm is None:
                    store.compare_set(f"{entry.base}/gen", str(entry.gen), str(entry.gen + 1))
                records = read_records(store, entry.prefix)
        except Exception:
            rendezvous.reset()  # the server is gone (with rank 0): reconnect on next use
        finally:
            _forget(entry)
    return records
