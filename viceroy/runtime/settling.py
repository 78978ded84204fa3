"""On a rank: a call that failed here while its peers may still run it holds this rank's next
collective until it has ended on them.

Calls sent without waiting queue on each rank (`block=False`, the tensor engine's batches), and
an actor's messages queue on its thread (a call behind a `broadcast`). A rank whose call failed
goes straight on to the next, while its peers may still wait in a collective of the failed call:
its next collective would meet theirs, as the same operation on the same communicator, and each
side would return the other's data. So:

- A call of the main thread that failed here (`failed`): the rank's next collective starts only
  once the controller says that call has ended on every rank (op "settled"; `wait_settled`).
- An actor's one-way broadcast that failed here (`oneway_failed`): nothing answers a broadcast,
  so the controller cannot say when it ended. The call stays known (`keep`), and the actor's
  next collective, in whatever call, starts only once the members of its group that ran the
  broadcast have finished it, asked through the controller (the call's `ask`, as a rank waiting
  in one of its collectives asks; `call_peers.peers_done` brings the answers).

By then a peer that waited in one of the failed call's collectives has given the communicator
up (it learnt this rank finished the call first), and the next collective builds a fresh one. A
rank that *finished* its call without joining a collective meets it from the next call, where
nothing here can tell: the controller sees it from the counts once the call ends (crossing.py).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from viceroy.runtime import call_peers
from viceroy.runtime.call_peers import CallPeers, check_cancelled

# Calls of the main thread that failed here and may still run on other ranks (see `failed`).
_unsettled: set[int] = set()
_settled_early: set[int] = set()  # said to have ended before it failed here (given up on; see main_call_starts)
_settled = call_peers.word  # on call_peers' lock: its `peers_done` notifies it too
# The controller ends a failed call within seconds (fail-fast, then giving up on ranks that do
# not stop); past this a collective goes ahead all the same, so no word lost can hold it.
SETTLE_WAIT_S = 30.0

_KEEP_FAILED = 16  # one-way calls that failed here an actor waits on, at most (see `keep`)


# --- calls of the main thread --------------------------------------------------------------


def failed(call_id: int) -> None:
    """Call `call_id` failed on this rank (main thread, before it answers): its next collective
    waits until the controller says the call ended everywhere (see `wait_settled`)."""
    with _settled:
        if call_id in _settled_early:  # given up on by the controller while it still ran here
            _settled_early.discard(call_id)
        else:
            _unsettled.add(call_id)


def main_call_starts(call_id: int) -> None:
    """The rank's main thread starts call `call_id`: those before it ended here, so the word
    that one of them ended everywhere, come before it failed here, is owed to none now."""
    if not _settled_early:  # nearly always: no lock taken on every call
        return
    with _settled:
        _settled_early.difference_update([c for c in _settled_early if c < call_id])


def settled(call_id: int) -> None:
    """The controller's word (control thread): call `call_id` has ended on every rank."""
    with _settled:
        if call_id in _unsettled:
            _unsettled.discard(call_id)
            _settled.notify_all()
        else:
            _settled_early.add(call_id)


# --- an actor's one-way calls -----------------------------------------------------------------


def oneway_failed() -> None:
    """The current call, one-way, failed here (see the module's docstring)."""
    state = call_peers.current()
    if state is not None and state.ask is not None:
        state.failed = True


def keep(failed: CallPeers, ran_on: frozenset[int]) -> None:
    """One-way call `failed` (returned by `call_peers.end_call`) ended here, having run on the
    other ranks `ran_on`: its actor's collectives wait for them from now on. It replaces those
    before it that ran on no rank it did not (peers finish an actor's one-way calls in the order
    sent); the oldest beyond a few are dropped."""
    settle = failed.settle
    assert settle is not None
    failed.until = time.monotonic() + SETTLE_WAIT_S
    failed.ask_at = 0.0  # the first wait asks at once
    failed.ran_on = ran_on
    dropped = [s for s in settle if s.ran_on is None or s.ran_on <= ran_on]
    for old in dropped:
        settle.remove(old)
    settle.append(failed)
    while len(settle) > _KEEP_FAILED:
        dropped.append(settle.pop(0))
    for old in dropped:
        call_peers.forget(old)


# --- before a collective ----------------------------------------------------------------------


def wait_settled(slice_s: float, members: Sequence[int] = (), me: int = -1) -> None:
    """Before a collective over `members` (this rank `me` among them): wait until every call
    that failed here has ended on all ranks, and every one-way call of the current call's actor
    that failed here has ended on the members that ran it, in waits of `slice_s` (an interrupt
    lands between them, and `check_cancelled` looks). Past SETTLE_WAIT_S it stops waiting for
    them."""
    state = call_peers.current()
    if state is not None and state.settle:
        for failed in list(state.settle):
            _wait_finished(failed, [r for r in members if r != me and (failed.ran_on is None or r in failed.ran_on)],
                           slice_s)
            with _settled:  # done with: every peer finished it, or was waited for long enough
                done_with = time.monotonic() >= failed.until or (failed.ran_on is not None
                                                                  and failed.ran_on <= failed.done.keys())
            if done_with and failed in state.settle:
                state.settle.remove(failed)
                call_peers.forget(failed)
    if not _unsettled:
        return
    deadline = time.monotonic() + SETTLE_WAIT_S
    while True:
        with _settled:
            if not _unsettled:
                return
            if time.monotonic() >= deadline:
                _unsettled.clear()
                return
            _settled.wait(slice_s)
        check_cancelled()


def _wait_finished(failed: CallPeers, peers: Sequence[int], slice_s: float) -> None:
    """Until `peers` have finished one-way call `failed` (or died, or their actors were
    stopped), asking them now and every ASK_EVERY_S; at most until `failed.until`."""
    while True:
        with _settled:
            left = [r for r in peers if r not in failed.done]
            now = time.monotonic()
            if not left or now >= failed.until:
                return
            ask = now >= failed.ask_at
            if ask:
                failed.ask_at = now + call_peers.ASK_EVERY_S
            else:
                _settled.wait(min(slice_s, failed.ask_at - now))
        if ask and failed.ask is not None:
            failed.ask(failed.call_id, left)
        check_cancelled()

