"""Rank output, made readable: lines grouped by rank set, and the progress block's text.

Pure logic, no IPython: `viceroy.extension.terminal.RankStreams` turns the raw chunks each rank
writes into complete lines and progress rows; `LineGrouper` merges the same line from several
ranks into one ``[0-3] hello`` while keeping every rank's own order, and emits in a stable rank
order.

>>> from viceroy.extension.terminal import RankStreams
>>> streams, grouper = RankStreams(), LineGrouper(ranks=[0, 1], window=0.1)
>>> for r in (0, 1):
...     for stream, text in streams.feed(r, "stdout", "hello\\n").lines:
...         grouper.add(r, stream, text, now=0.0)
>>> [format_line(g) for g in grouper.ready(now=0.0)]
['[0-1] hello']
"""

from __future__ import annotations

import collections
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from viceroy.runtime.shape import format_rank_set

__all__ = ["format_rank_set"]  # re-exported: the magics name rank sets the way errors do


@dataclass(eq=False)
class LineGroup:
    """One line of text written by a set of ranks (a node of `LineGrouper`'s timeline)."""

    stream: str
    text: str
    ranks: set[int]
    seq: int
    born: float
    payload: object = None  # a display (MIME bundle) from one rank: kept in order, never merged
    key: str = ""  # what ranks' lines must share to join it (`line_key`)
    prev: LineGroup | None = field(default=None, repr=False)
    next: LineGroup | None = field(default=None, repr=False)
    anchored: set[int] = field(default_factory=set, repr=False)  # ranks whose next line goes after it


# A log record's wall-clock time, which differs by milliseconds from rank to rank: a date and
# a time (logging's asctime, ISO 8601), or glog's "W1203 16:06:28.606863991" (torch's C++ logs),
# with the process or thread id glog's header may follow it with (torch.distributed's Python
# logs: "W1203 16:17:17.979000 22727 file:line]"). Only a date or fractional seconds make it
# one: tqdm's "[00:01<00:00]" and a duration differ between ranks for a reason.
_TIMESTAMP = re.compile(
    r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?"
    r"|(?<![^\[\s])[IWEF]\d{4} \d{2}:\d{2}:\d{2}\.\d+(?: +\d+(?= ))?"
)
KEY_HEAD = 100  # a log prefix's timestamp is looked for in a line's first this many characters
_RANK_PREFIX = re.compile(r"\[rank(\d+)\]:")


def own_line(rank: int, text: str) -> str:
    """``text`` as the cell shows it for ``rank``: without the ``[rankN]:`` that torch's C++
    logs start with once a process group exists, when N is this rank (the tag says so)."""
    if text.startswith("[rank"):
        m = _RANK_PREFIX.match(text)
        if m and int(m.group(1)) == rank:
            return text[m.end() :]
    return text


def line_key(text: str) -> str:
    """What the same line from several ranks has in common: the line, but for the timestamp
    of a log record (see `_TIMESTAMP`), so that one record logged on every rank is one line."""
    head = text[:KEY_HEAD]
    if ":" not in head:
        return text
    masked = _TIMESTAMP.sub("\x00", head)  # a character no line of text holds
    return text if masked == head else masked + text[KEY_HEAD:]


def format_line(group: LineGroup) -> str:
    """``[0-3] hello``"""
    return f"[{format_rank_set(group.ranks)}] {group.text}"


class LineGrouper:
    """Groups identical lines from several ranks that arrive within ``window`` seconds.

    Identical but for a log record's timestamp (`line_key`): the group shows the first rank's.
    A ``[rankN]:`` prefix naming the line's own rank (torch's C++ logs) is dropped (`own_line`).

    Pending lines sit on one timeline that every rank walks forward: a rank's next line joins
    an identical line a little ahead of its position, or is inserted at its position. So every
    rank's lines keep their order, and ranks printing the same sequence share every line.
    Lines due at the same time are shown lowest rank first, so the order on screen does not
    depend on arrival jitter. A line every rank of the call wrote is released at once.

    While some ranks of the call have written nothing yet (a rank scheduled late on a busy
    machine), lines wait up to ``silent_window`` for them instead, unless those ranks are done.

    The timeline is a linked list, each rank's position a node of it (its next line goes right
    after), and each rank keeps its pending lines in a queue: a line can be shown once it heads
    the queue of every rank in it. Adding and showing a line cost the same however many lines
    are pending (a flood that never groups, or one rank logging while the others stay silent).
    """

    LOOKAHEAD = 32  # how far ahead of its position a rank looks for an identical line

    def __init__(
        self, ranks: Sequence[int], window: float = 0.1, silent_window: float = 0.5
    ) -> None:
        self.ranks = set(ranks)
        self.window = window
        self.silent_window = max(window, silent_window)
        self._heard: set[int] = set()  # ranks that wrote something, or finished
        self._seq = 0
        self._start = LineGroup("", "", set(), 0, 0.0)  # the timeline's sentinel: before every line
        self._pending = 0
        self._queues: dict[int, collections.deque[LineGroup]] = {}  # rank -> its pending lines, in order
        self._at: dict[int, LineGroup] = {}  # rank -> the node its next line goes after

    def add(self, rank: int, stream: str, text: str, now: float, payload: object = None) -> None:
        """One line from ``rank`` (or, with ``payload``, a display to keep in its place)."""
        self._heard.add(rank)
        at = self._at.get(rank, self._start)
        key = ""
        if payload is None:
            text = own_line(rank, text)
            key = line_key(text)
            g = at.next
            for _ in range(self.LOOKAHEAD):
                if g is None:
                    break
                # rank is not in g (g lies past the rank's position)
                if g.key == key and g.stream == stream and g.payload is None:
                    g.ranks.add(rank)
                    self._queues.setdefault(rank, collections.deque()).append(g)
                    self._move(rank, at, g)
                    return
                g = g.next
        self._seq += 1
        g = LineGroup(stream, text, {rank}, self._seq, now, payload, key, prev=at, next=at.next)
        if at.next is not None:
            at.next.prev = g
        at.next = g
        self._pending += 1
        self._queues.setdefault(rank, collections.deque()).append(g)
        self._move(rank, at, g)

    def _move(self, rank: int, old: LineGroup, new: LineGroup) -> None:
        old.anchored.discard(rank)
        new.anchored.add(rank)
        self._at[rank] = new

    def last_pending(self, rank: int) -> LineGroup | None:
        """The last of ``rank``'s lines still pending, if any."""
        q = self._queues.get(rank)
        return q[-1] if q else None

    def rank_done(self, rank: int) -> None:
        """``rank`` finished the call: no line needs to wait for it any more."""
        self._heard.add(rank)

    def _window(self) -> float:
        return self.window if self._heard >= self.ranks else self.silent_window

    def _heads(self) -> list[LineGroup]:
        """Pending lines with no earlier pending line of any of their ranks."""
        heads: dict[int, LineGroup] = {}
        for q in self._queues.values():
            if q:
                g = q[0]
                if id(g) not in heads and all(self._queues[r][0] is g for r in g.ranks):
                    heads[id(g)] = g
        return list(heads.values())

    def _remove(self, g: LineGroup) -> None:
        """Take head `g` off the timeline; ranks positioned at it move to the line before."""
        assert g.prev is not None
        g.prev.next = g.next
        if g.next is not None:
            g.next.prev = g.prev
        for r in g.ranks:
            self._queues[r].popleft()
        for r in g.anchored:
            self._at[r] = g.prev
        g.prev.anchored |= g.anchored
        g.anchored = set()
        g.prev = g.next = None
        self._pending -= 1

    def ready(self, now: float) -> list[LineGroup]:
        """Groups due at ``now`` (or that every rank joined), in display order."""
        return self._take(now)

    def drain(self) -> list[LineGroup]:
        """Everything still pending, in display order (at the end of a call)."""
        return self._take(float("inf"))

    def next_deadline(self) -> float | None:
        """When the oldest pending line becomes due, or None if nothing is pending."""
        heads = self._heads()
        return min(g.born for g in heads) + self._window() if heads else None

    def _take(self, now: float) -> list[LineGroup]:
        out: list[LineGroup] = []
        cutoff: float | None = None  # lines born up to here count as simultaneous
        while self._pending:
            heads = self._heads()
            if cutoff is None:
                oldest = min(g.born for g in heads)
                window = self._window()
                if now - oldest >= window:
                    cutoff = oldest + window
            due = [
                g
                for g in heads
                if g.ranks >= self.ranks
                or (cutoff is not None and (g.born <= cutoff or now == float("inf")))
            ]
            if not due:
                break
            best = min(due, key=lambda g: (min(g.ranks), g.seq))
            self._remove(best)
            out.append(best)
        if not self._pending:
            self._start.anchored.clear()
            self._at.clear()
        return out


def format_progress(progress: Mapping[int, Sequence[str]]) -> str:
    """A progress block's text: each rank's rows tagged with its rank, ranks with the same rows
    sharing them.

    >>> format_progress({0: ["50%"], 1: ["50%"], 2: ["10%"]})
    '[0-1] 50%\\n[2] 10%'
    """
    groups: dict[tuple[str, ...], list[int]] = {}
    for rank in sorted(progress):
        if progress[rank]:
            groups.setdefault(tuple(progress[rank]), []).append(rank)
    return "\n".join(
        f"[{format_rank_set(ranks)}] {row}" for rows, ranks in groups.items() for row in rows
    )
