"""Building a group's communicator: every member joins the same generation through the
rendezvous store, and a helper thread connects while the caller waits in slices (so an interrupt,
a member that left the call, or one that never comes ends the wait). See `communicators` for
generations.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from viceroy.runtime import call_peers
from viceroy.runtime.collectives.backend import Backend, Communicator
from viceroy.runtime.collectives.checking import checking
from viceroy.runtime.collectives.entries import (
    Entry,
    Key,
    cache,
    current_timeout,
    first_line,
    forget,
    give_up,
    joined,
    lock,
)
from viceroy.runtime.collectives.errors import CollectiveError
from viceroy.runtime.collectives.groups import Group
from viceroy.runtime.collectives.records import read_records
from viceroy.runtime.collectives.store import StoreGone, rendezvous
from viceroy.runtime.collectives.waiting import SLICE_S, uninterrupted
from viceroy.runtime.context import context
from viceroy.runtime.shape import describe_ranks

NOTE_AFTER_S = 10.0  # say who is missing when a group takes this long to form
_CHECKED = "checked"  # a member's mark in the store when its collectives are checked (see checking)

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


class _Stale(Exception):
    """The generation being built was left as stale by a member (see `_build`)."""


def get(what: str, backend: Backend, group: Group, device: int | None) -> Entry:
    key = (backend.name, group.ranks, device)
    entry = cache.get(key)
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
    with lock:
        cache[key] = built
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
    index, timeout = group.index(me), current_timeout()
    with _store_ops():
        try:
            store, incarnation = rendezvous.get(timeout)
        except StoreGone as exc:
            raise _group_failed(what, group, f"{exc}, while the others waited for it.") from None
        base = f"viceroy/{incarnation}/{backend.name}/{group.name}"
        if device is not None:
            base += f"/dev{device}"
        gen = int(store.add(f"{base}/gen", 0))
        while f"{base}/g{gen}" in joined:
            # A generation this process joined before and did not see through (its give-up
            # was cut short): leave it, so peers that join it stop, and build the next one.
            give_up(Entry(None, key, base, incarnation, gen),
                     f"rank {me} left a stale attempt to form the group", stale=True)
            gen = int(store.add(f"{base}/gen", 0))
        entry = Entry(None, key, base, incarnation, gen, checked=checking())
        joined.add(entry.prefix)
        store.set(f"{entry.prefix}/here/{index}", _CHECKED if entry.checked else "1")
        if entry.checked:  # counted too: one read after the build says whether all agree
            store.add(f"{entry.prefix}/checked", 1)

    def connect() -> Communicator:
        client = rendezvous.client(timeout)
        store = PrefixStore(f"{entry.prefix}/{backend.name}", client)
        comm = backend.connect(store, index, group.size, device, timeout)
        # Only after a build that went through: one that failed or timed out may leave a wait
        # of the client's outstanding on the server, whose answer would confuse its next user.
        rendezvous.give_back(client, incarnation)
        return comm

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
            give_up(entry, why, stale=stale, shared=shared)

        uninterrupted(leave)
        raise
    if helper.error is not None or helper.comm is None:
        cause = first_line(helper.error) if helper.error else "no communicator"
        with contextlib.suppress(RuntimeError):  # the backend timed out waiting: say for whom
            missing = [r for i, r in enumerate(group.ranks) if not store.check([f"{entry.prefix}/here/{i}"])]
            if missing:
                cause = _not_joined(missing, timeout)
        give_up(entry, f"rank {me} could not build its {backend.name} communicator: {cause}")
        raise CollectiveError(f"{what} over {group.label}: {cause}") from None
    entry.comm = helper.comm
    with _store_ops():  # built: every member has read `gen`, the next build gets a fresh one
        store.compare_set(f"{base}/gen", str(gen), str(gen + 1))
        mixed = 0 < int(store.add(f"{entry.prefix}/checked", 0)) < group.size  # alike on every member
        checked = [r for i, r in enumerate(group.ranks)
                   if mixed and store.get(f"{entry.prefix}/here/{i}").decode() == _CHECKED]  # who is which
    if mixed:  # every member refuses alike
        forget(entry)
        unchecked = [r for r in group.ranks if r not in checked]
        raise CollectiveError(
            f"{what} over {group.label}: collectives are checked on {describe_ranks(checked)} but not on "
            f"{describe_ranks(unchecked)}; nothing was sent. Call vr.check_collectives() (or "
            "vr.check_collectives(False)) in code that runs on every rank: a rank restarted alone starts unchecked")
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
    return f"rank {me} failed while the group was forming: {first_line(exc)}"


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
                                            f"to form.{call_peers.order_hint(gone)}")
        if now - began > timeout:
            raise _group_failed(what, group, _not_joined(missing, timeout))
        if not noted and now - began > NOTE_AFTER_S and missing:
            noted = True
            print(f"viceroy: rank {context().rank}: {what} over {group.label} is waiting for "
                  f"{describe_ranks(missing)} to join", file=sys.stderr, flush=True)


def _not_joined(missing: list[int], timeout: float) -> str:
    """``rank 3 did not join within 2 s (is it running this code?)``"""
    they = "is it" if len(missing) == 1 else "are they"
    return f"{describe_ranks(missing)} did not join within {timeout:.0f} s ({they} running this code?)"
