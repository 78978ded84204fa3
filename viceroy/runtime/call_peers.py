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

Only calls on the rank's main thread count; actors' threads are left out. Stock
torch.distributed collectives are not counted (they block in C++, where this cannot look).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from viceroy.runtime.shape import describe_ranks

_lock = threading.Lock()
_main = threading.main_thread().ident
_counts: dict[str, list[Any]] = {}  # group (by name) -> [collectives started on it in the current call, the last one's signature]
_current: tuple[str, int] | None = None  # (group, its count) of the one in progress
_done: dict[int, dict[str, list[Any]] | None] = {}  # peers that finished the current call -> their counts (None: died)


def begin_call() -> None:
    """A new call starts on the main thread."""
    global _current
    with _lock:
        _counts.clear()
        _done.clear()
        _current = None


def counts() -> dict[str, list[Any]]:
    """What to report with this rank's answer: ``{group: [collectives started, the last one's
    signature]}`` (empty: no collective was started)."""
    with _lock:
        return {group: list(c) for group, c in _counts.items()}


def started(group: str, sig: str | None = None) -> None:
    """The calling thread starts a collective on `group`, passing what `sig` describes
    (counted on the main thread only)."""
    global _current
    if threading.get_ident() != _main:
        return
    with _lock:
        c = _counts.setdefault(group, [0, None])
        c[0], c[1] = c[0] + 1, sig
        _current = (group, c[0])


def peers_done(done: dict[int, dict[str, list[Any]] | None]) -> None:
    """The controller's word (control thread): these ranks finished the current call."""
    with _lock:
        _done.update(done)


def skipped(members: Sequence[int]) -> list[int]:
    """Members of the group of the collective in progress (main thread) that finished the call
    without starting it, or died."""
    if threading.get_ident() != _main:
        return []
    with _lock:
        if _current is None or not _done:
            return []
        group, n = _current
        return [r for r in members if r in _done and ((cc := _done[r]) is None or cc.get(group, (0,))[0] < n)]


def finished_with(members: Sequence[int]) -> dict[int, str]:
    """Members of the group of the collective in progress (main thread) that finished the call
    with it as their last one on the group: the signature of what each passed to it. (One that
    went further may have returned from more than this one legitimately, a broadcast's root
    say, and is left out.)"""
    if threading.get_ident() != _main:
        return {}
    with _lock:
        if _current is None or not _done:
            return {}
        group, n = _current
        return {r: c[1] for r in members if (cc := _done.get(r)) and (c := cc.get(group)) and c[0] == n and c[1] is not None}


def died(ranks: Sequence[int]) -> list[int]:
    """Those of `ranks` the controller said died."""
    with _lock:
        return [r for r in ranks if r in _done and _done[r] is None]


def gone(ranks: Sequence[int]) -> str:
    """What happened to `ranks` (from `skipped`): "rank 3 died", "ranks 1-2 finished the call
    without joining this collective", or both."""
    dead = died(ranks)
    left = [r for r in ranks if r not in dead]
    parts = []
    if dead:
        parts.append(f"{describe_ranks(dead)} died")
    if left:
        parts.append(f"{describe_ranks(left)} finished the call without joining this collective")
    return " and ".join(parts)
