"""Rank output, made readable: complete lines, progress bars, and lines grouped by rank set.

Pure logic, no IPython: `RankStreams` turns the raw chunks each rank writes into complete lines
and progress updates; `LineGrouper` merges the same line from several ranks into one
``[0-3] hello`` while keeping every rank's own order, and emits in a stable rank order.

>>> streams, grouper = RankStreams(), LineGrouper(ranks=[0, 1], window=0.1)
>>> for r in (0, 1):
...     for stream, text, _ in streams.feed(r, "stdout", "hello\\n").lines:
...         grouper.add(r, stream, text, now=0.0)
>>> [format_line(g) for g in grouper.ready(now=0.0)]
['[0-1] hello']
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from viceroy.runtime.shape import format_rank_set

__all__ = ["format_rank_set"]  # re-exported: the magics name rank sets the way errors do

# A line longer than this without a newline is shown in pieces of about this size (each a
# line), not buffered forever; the newline that ends it adds no empty line.
MAX_PARTIAL = 64_000


def terminal_line(text: str) -> str:
    """What a terminal would show for a line containing carriage returns."""
    if "\r" not in text:
        return text
    for part in reversed(text.split("\r")):
        if part:
            return part
    return ""


@dataclass
class Fed:
    """What one chunk of rank output produced."""

    # completed lines: (stream, text, was_progress); was_progress marks a line drawn with \r
    lines: list[tuple[str, str, bool]] = field(default_factory=list)
    progress: str | None = None  # the rank's current progress line, if the chunk moved it


class RankStreams:
    """Reassembles each rank's stream chunks into lines; ``\\r`` rewrites make progress, not lines.

    >>> s = RankStreams()
    >>> s.feed(0, "stderr", "\\r 10%").progress
    ' 10%'
    >>> s.feed(0, "stderr", "\\r100%\\n").lines
    [('stderr', '100%', True)]
    """

    def __init__(self) -> None:
        self._partial: dict[tuple[int, str], str] = {}
        self._cut: set[tuple[int, str]] = set()  # a line was cut at MAX_PARTIAL, not yet ended

    def feed(self, rank: int, stream: str, text: str) -> Fed:
        out = Fed()
        key = (rank, stream)
        buf = self._partial.pop(key, "") + text
        *complete, rest = buf.split("\n")
        if complete and key in self._cut:
            self._cut.discard(key)
            if not complete[0]:  # the newline ending a line already shown in pieces
                complete.pop(0)
        for raw in complete:
            out.lines.append((stream, terminal_line(raw), "\r" in raw.rstrip("\r")))
        if len(rest) > MAX_PARTIAL:
            out.lines.append((stream, terminal_line(rest), False))
            self._cut.add(key)
            rest = ""
        if rest:
            self._partial[key] = rest
            if "\r" in rest:
                out.progress = terminal_line(rest)
        return out

    def flush(self) -> list[tuple[int, str, str]]:
        """Unfinished lines (no trailing newline) as ``(rank, stream, text)``, rank order."""
        out = [
            (rank, stream, terminal_line(text))
            for (rank, stream), text in sorted(self._partial.items())
        ]
        self._partial.clear()
        self._cut.clear()
        return out


@dataclass(eq=False)
class LineGroup:
    """One line of text written by a set of ranks."""

    stream: str
    text: str
    ranks: set[int]
    seq: int
    born: float
    payload: object = None  # a display (MIME bundle) from one rank: kept in order, never merged


def format_line(group: LineGroup) -> str:
    """``[0-3] hello``"""
    return f"[{format_rank_set(group.ranks)}] {group.text}"


class LineGrouper:
    """Groups identical lines from several ranks that arrive within ``window`` seconds.

    Pending lines sit on one timeline that every rank walks forward: a rank's next line joins
    an identical line a little ahead of its position, or is inserted at its position. So every
    rank's lines keep their order, and ranks printing the same sequence share every line.
    Lines due at the same time are shown lowest rank first, so the order on screen does not
    depend on arrival jitter. A line every rank of the call wrote is released at once.

    While some ranks of the call have written nothing yet (a rank scheduled late on a busy
    machine), lines wait up to ``silent_window`` for them instead, unless those ranks are done.
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
        self._timeline: list[LineGroup] = []
        self._pos: dict[int, int] = {}  # rank -> timeline index just after its last line

    def add(self, rank: int, stream: str, text: str, now: float, payload: object = None) -> None:
        """One line from ``rank`` (or, with ``payload``, a display to keep in its place)."""
        self._heard.add(rank)
        pos = self._pos.get(rank, 0)
        if payload is None:
            for i in range(pos, min(pos + self.LOOKAHEAD, len(self._timeline))):
                g = self._timeline[i]
                # rank is not in g (g lies past the rank's position)
                if g.text == text and g.stream == stream and g.payload is None:
                    g.ranks.add(rank)
                    self._pos[rank] = i + 1
                    return
        self._seq += 1
        self._timeline.insert(pos, LineGroup(stream, text, {rank}, self._seq, now, payload))
        for r, p in self._pos.items():
            if p > pos:
                self._pos[r] = p + 1
        self._pos[rank] = pos + 1

    def rank_done(self, rank: int) -> None:
        """``rank`` finished the call: no line needs to wait for it any more."""
        self._heard.add(rank)

    def _window(self) -> float:
        return self.window if self._heard >= self.ranks else self.silent_window

    def _heads(self) -> list[tuple[int, LineGroup]]:
        """Pending lines with no earlier pending line of any of their ranks."""
        heads: list[tuple[int, LineGroup]] = []
        blocked: set[int] = set()
        for i, g in enumerate(self._timeline):
            if not (g.ranks & blocked):
                heads.append((i, g))
            blocked |= g.ranks
            if len(blocked) >= len(self.ranks) and blocked >= self.ranks:
                break
        return heads

    def _remove(self, i: int) -> None:
        del self._timeline[i]
        for r, p in self._pos.items():
            if p > i:
                self._pos[r] = p - 1

    def ready(self, now: float) -> list[LineGroup]:
        """Groups due at ``now`` (or that every rank joined), in display order."""
        return self._take(now)

    def drain(self) -> list[LineGroup]:
        """Everything still pending, in display order (at the end of a call)."""
        return self._take(float("inf"))

    def next_deadline(self) -> float | None:
        """When the oldest pending line becomes due, or None if nothing is pending."""
        heads = self._heads()
        return min(g.born for _, g in heads) + self._window() if heads else None

    def _take(self, now: float) -> list[LineGroup]:
        out: list[LineGroup] = []
        cutoff: float | None = None  # lines born up to here count as simultaneous
        while self._timeline:
            heads = self._heads()
            if cutoff is None:
                oldest = min(g.born for _, g in heads)
                window = self._window()
                if now - oldest >= window:
                    cutoff = oldest + window
            due = [
                (i, g)
                for i, g in heads
                if g.ranks >= self.ranks
                or (cutoff is not None and (g.born <= cutoff or now == float("inf")))
            ]
            if not due:
                break
            i, best = min(due, key=lambda ig: (min(ig[1].ranks), ig[1].seq))
            self._remove(i)
            out.append(best)
        if not self._timeline:
            self._pos.clear()
        return out


def format_progress(progress: dict[int, str]) -> str:
    """The live progress block: one line per distinct progress text, tagged with its ranks.

    >>> format_progress({0: "50%", 1: "50%", 2: "10%"})
    '[0-1] 50%\\n[2] 10%'
    """
    groups: dict[str, list[int]] = {}
    for rank in sorted(progress):
        groups.setdefault(progress[rank], []).append(rank)
    return "\n".join(f"[{format_rank_set(ranks)}] {text}" for text, ranks in groups.items())
