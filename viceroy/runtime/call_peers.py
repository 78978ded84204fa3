"""On a rank: which peers have already finished the call this rank is running, and whether one
left without joining the collective this rank waits in (``if rank != 2: vr.all_reduce(t)``),
which would otherwise wait for it forever.

Each rank counts the collectives it starts on each group during a call and reports the counts
with its answer, with what it passed to the last one (its signature, see
`collectives.agreement`). When a call has been partly answered for a while, the controller tells the
ranks still running it who finished, with their counts (op "peers_done"). A rank waiting in its
n-th collective on a group, for a member that finished the call having started fewer than n on
that group, knows that member skipped it. A member that took part and finished first (a ring
all_reduce ends at slightly different times) started as many, so it is never blamed. Of a
member that died the ranks are told at once (no counts): no collective with it can end, and
without word of it a rank would wait until the collective's own timeout (a host cut off leaves
its connections open). A member that finished the call with the collective this rank waits in
as its last on the group, having passed something else, got its share and returned: the two
will never agree, and `finished_with` says what it passed.

A call is a `%%mesh` cell or `mesh.run` on the rank's main thread, or an actor endpoint on its
actor's thread (or task, for async endpoints): each runs within its own `CallPeers`, held in a
context variable, so an actor endpoint's collectives are watched as a cell's are, by the call
that runs them. Code with no call around it (a thread the user started) is not watched. Stock
torch.distributed collectives are not counted (they block in C++, where this cannot look).

An actor endpoint called on part of its actor mesh (a slice, `choose`) knows from the start
which of its actor mesh's ranks the call was not sent to (`outside`): a collective over a group
with any of them could only wait for its timeout, so it is refused at once (`not_in_call`).

An actor's one-way broadcasts have no answers, so the controller cannot say who finished
them: a rank waiting in a collective of one asks instead (`ask`, every `ASK_EVERY_S`), and
the ranks that finished it answer through the controller with their counts, as `peers_done`.
A member whose actor was stopped never runs it, nor answers for it: it is said so (`STOPPED`),
and counts as gone, as a dead one does.

A call that failed here while its peers may still run it holds this rank's next collective
until it ended on them: `viceroy.runtime.settling`, which waits on `word` for what the
controller says of them.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

from viceroy.runtime.shape import describe_ranks

_lock = threading.Lock()
_running: dict[int, CallPeers] = {}  # call id -> its state, for the control thread's word

# A one-way call waiting in a collective this long asks who finished it, and again as often.
ASK_EVERY_S = 1.0

# Notified when word of a peer comes for a one-way call that failed here (see settling.py).
word = threading.Condition(_lock)

# A member's word in `CallPeers.done`, for an actor's one-way call: its actor was stopped (see above).
STOPPED = "stopped"
# A peer that finished a call: the collectives it started in it, or how it is gone (None: died; STOPPED).
Done = dict[str, list[Any]] | str | None


class CallPeers:
    """One call's collectives and what the controller said of its peers."""

    __slots__ = ("actor", "ask", "ask_at", "call_id", "cancelled", "constructing", "counts", "current", "done",
                 "failed", "outside", "ran_on", "settle", "until")

    def __init__(self, call_id: int, outside: Collection[int] = (),
                 ask: Callable[[int, Sequence[int]], None] | None = None, actor: bool = False,
                 constructing: bool = False, settle: list[CallPeers] | None = None) -> None:
        self.call_id = call_id
        self.constructing = constructing  # an actor's constructor (`outside`: not restarted with it)
        self.actor = actor  # an actor's endpoint (or constructor): other actor meshes may run beside it
        self.outside = outside  # ranks of the actor mesh the call was not sent to
        self.ask = ask  # one-way calls: asks the members of a group who finished it
        self.ask_at = 0.0  # when to ask next (0: once it has waited ASK_EVERY_S)
        # group (by name) -> [collectives started in this call, the last one's signature(, True: one failed)]
        self.counts: dict[str, list[Any]] = {}
        self.current: tuple[str, int] | None = None  # (group, its count) of the one in progress
        self.done: dict[int, Done] = {}  # peers that finished the call -> their counts (None: died; STOPPED)
        self.cancelled = False  # interrupted where no signal reaches (an actor's thread): see `check_cancelled`
        # An actor's one-way calls that failed here, oldest first, shared by its calls: their
        # peers must have finished them before a collective of this call starts (settling.py).
        self.settle = settle
        self.failed = False  # a one-way call that failed here (see `settling.oneway_failed`)
        self.ran_on: frozenset[int] | None = None  # its other ranks (None: every member of a group)
        self.until = 0.0  # when its peers are no longer waited for


_call: contextvars.ContextVar[CallPeers | None] = contextvars.ContextVar("viceroy_call_peers", default=None)


def begin_call(call_id: int, told: bool = True, outside: Collection[int] = (),
               ask: Callable[[int, Sequence[int]], None] | None = None, actor: bool = False,
               constructing: bool = False, settle: list[CallPeers] | None = None) -> contextvars.Token[CallPeers | None]:
    """A call starts in the current context (the main thread's, an actor thread's or task's);
    pass the token to `end_call`. `told`: the controller may send word of it. `outside`: ranks
    of the actor mesh the call was not sent to (see `not_in_call`). `ask(call_id, members)`: for
    a call nobody answers (a one-way broadcast), asks who of `members` finished it (see `skipped`).
    `actor`: the call is an actor's (see `in_actor`); `constructing`: its constructor's.
    `settle`: the actor's list of one-way calls that failed here (see settling.py)."""
    state = CallPeers(call_id, outside, ask, actor, constructing, settle)
    if told:
        with _lock:
            _running[call_id] = state
    return _call.set(state)


def end_call(token: contextvars.Token[CallPeers | None]) -> CallPeers | None:
    """The call of the current context ends. A one-way call that failed here
    (`settling.oneway_failed`) stays known, for the word on its peers: it is returned, for
    `settling.keep`."""
    state = _call.get()
    _call.reset(token)
    if state is None:
        return None
    kept = state.failed and state.settle is not None
    if not kept:
        with _lock:
            if _running.get(state.call_id) is state:
                del _running[state.call_id]
    return state if kept else None


def forget(state: CallPeers) -> None:
    """A call kept by `end_call` is done with."""
    with _lock:
        if _running.get(state.call_id) is state:
            del _running[state.call_id]


def current() -> CallPeers | None:
    """The current context's call."""
    return _call.get()


def counts() -> dict[str, list[Any]]:
    """What to report with the current call's answer: ``{group: [collectives started, the last
    one's signature(, True when one failed: see `broke`)]}`` (empty: no collective was started)."""
    state = _call.get()
    if state is None or not state.counts:  # only this context's thread adds to them
        return {}
    with _lock:
        return {group: list(c) for group, c in state.counts.items()}


def started(group: str, sig: str | None = None) -> None:
    """The current call starts a collective on `group`, passing what `sig` describes."""
    state = _call.get()
    if state is None:
        return
    with _lock:
        c = state.counts.setdefault(group, [0, None])
        c[0], c[1] = c[0] + 1, sig
        state.current = (group, c[0])


def broke(group: str) -> None:
    """The current call's collective on `group` failed here (the communicator given up, or a
    usage error): the members' counts on it are not compared when the call ends (see crossing.py)."""
    state = _call.get()
    if state is None:
        return
    with _lock:
        c = state.counts.get(group)
        if c is not None and len(c) == 2:
            c.append(True)


def peers_done(call_id: int, done: dict[int, Done]) -> bool:
    """The controller's word (control thread): these ranks finished call `call_id`. False when
    no such call runs here."""
    with _lock:
        state = _running.get(call_id)
        if state is None:
            return False
        state.done.update(done)
        if state.failed:  # a later collective may wait for this word (settling.py)
            word.notify_all()
        return True


def cancel(call_id: int) -> bool:
    """Mark call `call_id` interrupted (control thread), for waits that no signal reaches: an
    actor endpoint's collectives raise KeyboardInterrupt at their next look. False when no such
    call runs here."""
    with _lock:
        state = _running.get(call_id)
        if state is not None:
            state.cancelled = True
        return state is not None


def cancelled() -> bool:
    """Whether the current call was cancelled (see `cancel`)."""
    state = _call.get()
    return state is not None and state.cancelled


def check_cancelled() -> None:
    """Raise KeyboardInterrupt when the current call was cancelled (see `cancel`)."""
    if cancelled():
        raise KeyboardInterrupt


def in_actor() -> bool:
    """Whether the current call is an actor's endpoint (or constructor): ranks outside its
    actor mesh may run actors of other meshes, which it may send to or receive from."""
    state = _call.get()
    return state is not None and state.actor


def not_in_call(members: Sequence[int], sig: str | None) -> str:
    """Why a collective over `members` cannot end in the current call, or "": some are actors
    of the called actor mesh that the call was not sent to. Point to point (`sig` "send/recv")
    is left alone: its peer may run in a call of its own (``a.slice(gpus=1).recv_from.call()``)."""
    state = _call.get()
    if state is None or not state.outside or (sig or "").startswith("send/recv"):
        return ""
    absent = [r for r in members if r in state.outside]
    if not absent:
        return ""
    called = [r for r in members if r not in state.outside]
    one = len(absent) == 1
    which = "its actor is" if one else "their actors are"
    if state.constructing:  # a restart's respawn: only the failed actors run their constructor again
        return (f"{describe_ranks(absent)} of the group {'is' if one else 'are'} not being restarted ({which} "
                f"alive, and do{'es' if one else ''} not run the constructor again), so it would wait for "
                f"{'it' if one else 'them'} until its timeout. An actor whose constructor runs a collective "
                "over its actor mesh cannot be restarted alone: stop the actor mesh and spawn it again, or "
                "move the collective to an endpoint called on the whole actor mesh")
    return (f"{describe_ranks(absent)} of the group {'is' if one else 'are'} not in this call "
            f"({which} in the actor mesh, but the endpoint was called on part of it), so it would wait for "
            f"{'it' if one else 'them'} until its timeout. Call the endpoint on the whole actor "
            f"mesh, or run the collective over a group of the called actors only"
            + (f" ({describe_ranks(called)} here)" if called else ""))


def skipped(members: Sequence[int]) -> list[int]:
    """Members of the group of the current call's collective in progress that finished the call
    without starting it, or died. (A one-way call asks who finished it, now and then.)"""
    state = _call.get()
    if state is None:
        return []
    if state.ask is not None and (now := time.monotonic()) >= state.ask_at:
        if state.ask_at:
            state.ask(state.call_id, [r for r in members if r not in state.done])
        state.ask_at = now + ASK_EVERY_S
    with _lock:
        if state.current is None or not state.done:
            return []
        group, n = state.current
        done = state.done
        return [r for r in members if r in done and (not isinstance(cc := done[r], dict) or cc.get(group, (0,))[0] < n)]


def finished_with(members: Sequence[int]) -> dict[int, str]:
    """Members of the group of the current call's collective in progress that finished the call
    with it as their last one on the group: the signature of what each passed to it. (One that
    went further may have returned from more than this one legitimately, a broadcast's root
    say, and is left out.)"""
    state = _call.get()
    if state is None:
        return {}
    with _lock:
        if state.current is None or not state.done:
            return {}
        group, n = state.current
        done = state.done
        return {r: c[1] for r in members
                if isinstance(cc := done.get(r), dict) and (c := cc.get(group)) and c[0] == n and c[1] is not None}


def died(ranks: Sequence[int]) -> list[int]:
    """Those of `ranks` the controller said died (during the current call)."""
    return _said(ranks, None)


def _said(ranks: Sequence[int], how: str | None) -> list[int]:
    """Those of `ranks` the controller said are gone `how` (None: died; STOPPED)."""
    state = _call.get()
    if state is None:
        return []
    with _lock:
        return [r for r in ranks if r in state.done and state.done[r] == how]


def gone(ranks: Sequence[int]) -> str:
    """What happened to `ranks` (from `skipped`): "rank 3 died", "rank 1's actor was stopped",
    "ranks 1-2 finished the call without joining this collective", or several."""
    dead, stopped = died(ranks), _said(ranks, STOPPED)
    left = [r for r in ranks if r not in dead and r not in stopped]
    parts = []
    if dead:
        parts.append(f"{describe_ranks(dead)} died")
    if stopped:
        parts.append(f"{describe_ranks(stopped)}'s actor was stopped" if len(stopped) == 1
                     else f"the actors of {describe_ranks(stopped)} were stopped")
    if left:
        parts.append(f"{describe_ranks(left)} finished the call without joining this collective")
    return " and ".join(parts)


def order_hint(ranks: Sequence[int]) -> str:
    """Advice where some of `ranks` (from `skipped`) left without joining (none where they all
    died, or their actors were stopped)."""
    left = set(ranks) - set(died(ranks)) - set(_said(ranks, STOPPED))
    return " Every rank of a group must call its collectives, in the same order." if left else ""
