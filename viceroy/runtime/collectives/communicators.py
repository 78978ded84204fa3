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

from collections.abc import Callable
from typing import Any

from viceroy.runtime import call_peers, settling
from viceroy.runtime.collectives import building
from viceroy.runtime.collectives.agreement import Agreement
from viceroy.runtime.collectives.backend import Backend, Communicator, Pending
from viceroy.runtime.collectives.checking import Signatures
from viceroy.runtime.collectives.entries import (
    Entry,
    abort_all,
    first_line,
    forget,
    give_up,
    healthy,
    set_timeout,
)
from viceroy.runtime.collectives.errors import CollectiveError
from viceroy.runtime.collectives.groups import Group
from viceroy.runtime.collectives.records import root_cause
from viceroy.runtime.collectives.waiting import SLICE_S, uninterrupted
from viceroy.runtime.context import context

__all__ = ["abort_all", "run", "set_timeout"]


def run(what: str, backend: Backend, group: Group, device: int | None,
        start: Callable[[Communicator], Pending], sig: str | None = None, like: Any = None) -> None:
    """Run one operation on `group`, building its communicator if needed. On failure the
    communicator is aborted everywhere and a CollectiveError names the root cause.

    `sig` says what every member must agree on (the operation, the tensor's dtype and shape):
    an operation still waiting after `agreement.CHECK_AFTER_S` compares it with the other members',
    and a mismatch (which backends do not notice: they wait for bytes that never come) ends it
    everywhere, naming each rank's. With checking on (`entry.checked`), the members compare it first,
    over the communicator (in tensors like `like`), and a mismatch ends it before anything is sent."""
    if absent := call_peers.not_in_call(group.ranks, sig):  # an actor endpoint called on a slice, say
        raise CollectiveError(f"{what} over {group.label}: {absent}.")
    settling.wait_settled(SLICE_S, group.ranks, context().rank)  # a call that failed here has ended on its peers too
    call_peers.started(group.name, sig)
    try:
        _run_started(what, backend, group, device, start, sig, like)
    except BaseException:
        call_peers.broke(group.name)  # given up (or caught and gone on from): its counts no longer line up
        raise


def _run_started(what: str, backend: Backend, group: Group, device: int | None,
                 start: Callable[[Communicator], Pending], sig: str | None, like: Any) -> None:
    me = context().rank
    entry = building.get(what, backend, group, device)
    if not healthy(entry):
        forget(entry)  # the peers gave it up while we were elsewhere
        entry = building.get(what, backend, group, device)
    comm = entry.comm
    assert comm is not None
    started = False
    op, entry.ops = entry.ops, entry.ops + 1
    previous, entry.last_sig = entry.last_sig, sig
    try:
        if sig is not None and entry.checked:  # as on every member (compared when it was built)
            first = Signatures(sig, group.ranks, like)
            started = True  # the comparison moves data too: a failure in it breaks the group
            _wait(first.agree(comm), group, None)
            if first.differ():  # on every member alike
                _wait(first.gather(comm), group, None)
                raise _Refused(first.mismatch())
            started = False  # compared, and nothing of the operation itself sent yet
        pending = start(comm)
        started = True
        _wait(pending, group, Agreement(entry.prefix, op, entry.incarnation, sig, previous, group.ranks) if sig is not None else None)
    except _Skipped as exc:
        raise _without(entry, what, group, exc.ranks) from None
    except _Refused as exc:  # every member saw the same signatures, and refuses alike
        raise CollectiveError(
            f"{what} over {group.label}: the ranks passed different tensors or operations ({exc.args[0]}); "
            "nothing was sent (collectives are checked); every member must make the same call") from None
    except _Mismatch as exc:
        reason = f"the ranks passed different tensors or operations ({exc.args[0]}); every member must make the same call"
        give_up(entry, reason, shared=True)  # aborted: the members waiting with us stop too
        raise CollectiveError(f"{what} over {group.label}: {reason}") from None
    except KeyboardInterrupt:
        uninterrupted(lambda: give_up(entry, f"rank {me} was interrupted"))
        raise
    except Exception as exc:
        if not backend.is_failure(exc) or not (started or getattr(exc, "broken", False)):
            raise  # a usage error, raised before anything was sent
        if gone := call_peers.skipped(group.ranks):  # a member stopped first, on the same word
            raise _without(entry, what, group, gone) from None
        index = comm.lost_peer(exc)
        lost = None if index is None else group.ranks[index]
        reason = (f"rank {me} lost its connection to rank {lost}" if lost is not None
                  else f"rank {me}: {first_line(exc)}")
        cause = root_cause(give_up(entry, reason, lost) or [], lost, reason)
        raise CollectiveError(
            f"{what} over {group.label} failed: {cause}. The communicator was aborted; the "
            "next collective over this group builds a fresh one."
        ) from None


def _wait(pending: Pending, group: Group, check: Agreement | None) -> None:
    """Wait for `pending` in slices: an interrupt, a member that left or died, or (`check`) a
    mismatch found while waiting ends the wait."""
    while not pending.wait(SLICE_S):
        call_peers.check_cancelled()  # an actor's endpoint, interrupted (no signal reaches its thread)
        if gone := call_peers.skipped(group.ranks):
            raise _Skipped(gone)
        if check is not None and (mismatch := check.mismatch()):
            raise _Mismatch(mismatch)


class _Mismatch(Exception):
    pass


class _Refused(Exception):
    """Checked collectives: the signatures differ, and nothing was sent."""


class _Skipped(Exception):
    def __init__(self, ranks: list[int]) -> None:
        self.ranks = ranks


def _without(entry: Entry, what: str, group: Group, ranks: list[int]) -> CollectiveError:
    """Give the group up because `ranks` finished the call without joining this collective, or
    died; the error to raise. No "rank {me}" in it: the ranks that waited get one message,
    grouped as one."""
    reason = f"{call_peers.gone(ranks)}, while the others waited in it"
    give_up(entry, reason)  # the communicator is aborted: members waiting with us stop too
    return CollectiveError(f"{what} over {group.label}: {reason}.{call_peers.order_hint(ranks)}")
