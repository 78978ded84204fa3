"""On a rank: which peers have already finished the call this rank is running, and whether one
left without joining the collective this rank waits in (``if rank != 2: vr.all_reduce(t)``),
which would otherwise wait for it forever.

Each rank counts the collectives it starts on each group during a call and reports the counts
with its answer. When a call has been partly answered for a while, the controller tells the
ranks still running it who finished, with their counts (op "peers_done"). A rank waiting in its
n-th collective on a group, for a member that finished the call having started fewer than n on
that group, knows that member skipped it. A member that took part and finished first (a ring
all_reduce ends at slightly different times) started as many, so it is never blamed. Of a
member that died the ranks are told at once (no counts): no collective with it can end, and
without word of it a rank would wait until the collective's own timeout (a host cut off leaves
its connections open).

Only calls on the rank's main thread count; actors' threads are left out. Stock
torch.distributed collectives are not counted (they block in C++, where this cannot look).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from viceroy.runtime.shape import describe_ranks

_lock = threading.Lock()
_main = threading.main_thread().ident
_counts: dict[str, int] = {}  # collectives started on each group (by name) in the current call
_current: tuple[str, int] | None = None  # (group, its count) of the one in progress
_done: dict[int, dict[str, int] | None] = {}  # peers that finished the current call -> their counts (None: died)


def begin_call() -> None:
    """A new call starts on the main thread."""
    global _current
    with _lock:
        _counts.clear()
        _done.clear()
        _current = None


def counts() -> dict[str, int]:
    """What to report with this rank's answer (empty: no collective was started)."""
    with _lock:
        return dict(_counts)


def started(group: str) -> None:
    """The calling thread starts a collective on `group` (counted on the main thread only)."""
    global _current
    if threading.get_ident() != _main:
        return
    with _lock:
        n = _counts[group] = _counts.get(group, 0) + 1
        _current = (group, n)


def peers_done(done: dict[int, dict[str, int] | None]) -> None:
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
        return [r for r in members if r in _done and ((cc := _done[r]) is None or cc.get(group, 0) < n)]


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
