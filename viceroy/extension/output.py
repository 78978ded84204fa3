"""Rank output, made readable: complete lines, progress bars, and lines grouped by rank set.

Pure logic, no IPython: `RankStreams` turns the raw chunks each rank writes into complete lines
and progress updates; `LineGrouper` merges the same line from several ranks into one
``[0-3] hello`` while keeping every rank's own order, and emits in a stable rank order.

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
from collections.abc import Callable, Mapping, Sequence
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
    """What one chunk of a rank's output produced."""

    # finished lines, in order: (stream, text as a terminal shows it); a finished progress
    # bar's line is its last state
    lines: list[tuple[str, str]] = field(default_factory=list)
    # stream -> its live progress rows (top first), for the streams whose rows changed
    progress: dict[str, list[str]] = field(default_factory=dict)


# A control sequence: a line end, a carriage return, or an ANSI CSI escape (its parameters and
# final byte captured). A CSI cut at a chunk's end waits for the next chunk.
_CONTROL = re.compile(r"\r?\n|\r|\x1b\[([0-9;?]*)[ -/]*([@-~])")
_CUT_ESCAPE = re.compile(r"\x1b(\[[0-9;?]*[ -/]*)?\Z")
_SGR = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(eq=False)
class _Row:
    text: str = ""
    home: bool = True  # the cursor is at its start: the next text replaces the row
    drawn: bool = False  # drawn with \r (or erased): a progress bar, not a line being written


class _Screen:
    """One rank stream as a terminal shows it: the rows still live, top first, and a cursor.

    Text after a ``\r`` replaces its row (what `terminal_line` shows); ``\n`` moves down a row;
    ``ESC[A`` (cursor up, as tqdm's ``position=`` bars use) moves up; ``ESC[K``/``ESC[2K`` clear
    the row; colours stay and other escapes are dropped. A row is final, a line, once the
    cursor is further below it than the cursor was ever seen to go back up (``reach``), or a
    plain row (no ``\r``) ended by a newline: a bar can still be redrawn while it is in reach.
    Before the cursor was seen going up, a bar just ended is held until the row below it is
    redrawn in place or a plain line follows (tqdm's stacked bars draw the second bar once and
    go back up, and the cursor-up may come in the next chunk). A write to the rank's other
    stream lands at the cursor, below every row above it: those are final first (`release`).
    """

    def __init__(self) -> None:
        self.rows = [_Row()]
        self.cur = 0
        self.redraws = 0  # carriage returns on the cursor row since the cursor came to it
        self.reach = 0  # the most rows the cursor went up: rows further above it are final
        self.held = False  # a bar just ended is held (see above)
        self.cut: _Row | None = None  # a row shown in pieces (MAX_PARTIAL), not yet ended
        self.escape = ""  # an escape sequence cut at the end of the last chunk
        self.shown: list[str] = []  # the live rows last reported

    def feed(self, text: str, out: list[str]) -> None:
        """Write ``text``; append the rows it made final to ``out``."""
        if self._plain(text):  # the common case, a line at a time: no control but newlines
            *done, rest = text.split("\n")
            row = self.rows[0]
            if done:
                out.append(done[0] if row.home else row.text + done[0])
                out += done[1:]
                row.text, row.home = rest, not rest
            else:
                self._put(text)
            if len(row.text) <= MAX_PARTIAL:
                return
            text = ""  # too long: shown in pieces, below
        text = self.escape + text
        self.escape = ""
        cut = _CUT_ESCAPE.search(text)
        if cut:
            self.escape, text = text[cut.start() :], text[: cut.start()]
        final = 0  # rows above this index are final
        pos = 0
        for m in _CONTROL.finditer(text):
            if m.start() > pos:
                self._put(text[pos : m.start()])
            pos = m.end()
            c = m.group()
            if c[-1] == "\n":
                row = self.rows[self.cur]
                if row.text and not row.drawn:
                    final = self.cur + 1  # a line written once: it and all above are done
                self._down()
            elif c == "\r":
                row = self.rows[self.cur]
                row.home = row.drawn = True
                self.redraws += 1
            elif m.group(2) == "m":
                self._put(c)  # a colour: part of the text
            else:
                self._escape(m.group(1), m.group(2))
        if pos < len(text):
            self._put(text[pos:])
        self.held = (
            not self.reach and self.cur > final and self.rows[self.cur - 1].drawn and self.redraws < 2
        )  # maybe a stacked bar below a bar: wait and see
        final = max(final, self.cur - self.reach - self.held)
        if len(self.rows[self.cur].text) > MAX_PARTIAL:  # shown in pieces, not held forever
            final = self.cur + 1
        self._finish(final, out)

    def _plain(self, text: str) -> bool:
        """Whether ``text`` is plain lines written on one plain row (nothing live, nothing held)."""
        return (
            len(self.rows) == 1
            and not self.rows[0].drawn
            and self.cut is None
            and not self.escape
            and "\r" not in text
            and "\x1b" not in text
        )

    def release(self, out: list[str]) -> None:
        """The rank writes to its other stream, at the cursor: rows above it (a bar held, bars
        in reach that ended) are final, before that."""
        self.held = False
        self._finish(self.cur, out)

    def _put(self, text: str) -> None:
        row = self.rows[self.cur]
        row.text = text if row.home else row.text + text
        row.home = False

    def _down(self) -> None:
        self.cur += 1
        self.redraws = 0
        if self.cur == len(self.rows):
            self.rows.append(_Row())
        self.rows[self.cur].home = True

    def _escape(self, params: str, op: str) -> None:
        n = int(params) if params.isdigit() else 1
        row = self.rows[self.cur]
        if op in "AF":  # cursor up (F: to the line's start); rows gone for good stay gone
            self.reach = max(self.reach, len(self.rows) - 1 - (self.cur - n))
            self.cur = max(0, self.cur - n)
            self.redraws = 0
            self.rows[self.cur].home = self.rows[self.cur].home or op == "F"
        elif op in "BE":  # cursor down
            for _ in range(n):
                self._down()
        elif op == "K" and (params in ("1", "2") or row.home or not row.text):  # erase the line
            row.text, row.drawn = "", True
        # anything else (cursor shape, screen clears, ...) has nothing to show in a cell

    def _finish(self, final: int, out: list[str]) -> None:
        """Rows above ``final`` are done: out as lines (an erased bar leaves none)."""
        for row in self.rows[:final]:
            if row is self.cut and not row.text:
                continue  # the newline ending a line already shown in pieces
            if row.text.strip() or not row.drawn:
                out.append(row.text)
        if final > self.cur:  # the cursor row went out in pieces: the rest of it follows
            self.rows[self.cur] = self.cut = _Row(home=False)
            final = self.cur
        del self.rows[:final]
        self.cur -= final
        if self.cut is not None and self.cut not in self.rows:
            self.cut = None

    def live(self) -> list[str]:
        """The rows a progress block shows: bars (drawn rows), and ended rows still in reach."""
        return [
            r.text
            for i, r in enumerate(self.rows)
            if (r.drawn or i < self.cur) and _SGR.sub("", r.text).strip()
        ]

    def flush(self, out: list[str]) -> None:
        """The stream is over: ended rows and unfinished plain text become lines; bars still
        drawn stay live (their last state)."""
        self._finish(self.cur, out)
        rest = [r for r in self.rows if not r.drawn and r.text]
        out += [r.text for r in rest]
        self.rows = [r for r in self.rows if r.drawn] or [_Row()]
        self.cur = 0
        self.cut = None
        self.held = False


class RankStreams:
    """Reassembles each rank's stream chunks into lines, as a terminal shows them; the rows
    still being redrawn (``\\r`` progress bars, tqdm's stacked bars) are live progress.

    >>> s = RankStreams()
    >>> s.feed(0, "stderr", "\\r 10%").progress
    {'stderr': [' 10%']}
    >>> s.feed(0, "stderr", "\\r100%\\n").lines, s.feed(0, "stdout", "done\\n").lines
    ([], [('stderr', '100%'), ('stdout', 'done')])
    """

    def __init__(self) -> None:
        self._screens: dict[int, dict[str, _Screen]] = {}  # rank -> stream -> its screen

    def feed(self, rank: int, stream: str, text: str) -> Fed:
        screens = self._screens.setdefault(rank, {})
        fed = Fed()
        for other, held in screens.items():
            if other != stream and held.cur:
                self._take(fed, other, held, held.release)
        screen = screens.get(stream) or screens.setdefault(stream, _Screen())
        self._take(fed, stream, screen, lambda done: screen.feed(text, done))
        return fed

    def flush(self) -> dict[int, Fed]:
        """The end of a call: per rank, in rank order, its remaining lines (unfinished ones
        too) and the bars still live."""
        out = {}
        for rank in sorted(self._screens):
            fed = out[rank] = Fed()
            for stream, screen in sorted(self._screens[rank].items()):
                self._take(fed, stream, screen, screen.flush)
        return out

    @staticmethod
    def _take(fed: Fed, stream: str, screen: _Screen, write: Callable[[list[str]], None]) -> None:
        done: list[str] = []
        write(done)
        fed.lines += [(stream, text) for text in done]
        live = screen.live()
        if live != screen.shown:
            fed.progress[stream] = screen.shown = live


@dataclass(eq=False)
class LineGroup:
    """One line of text written by a set of ranks (a node of `LineGrouper`'s timeline)."""

    stream: str
    text: str
    ranks: set[int]
    seq: int
    born: float
    payload: object = None  # a display (MIME bundle) from one rank: kept in order, never merged
    prev: LineGroup | None = field(default=None, repr=False)
    next: LineGroup | None = field(default=None, repr=False)
    anchored: set[int] = field(default_factory=set, repr=False)  # ranks whose next line goes after it


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
        if payload is None:
            g = at.next
            for _ in range(self.LOOKAHEAD):
                if g is None:
                    break
                # rank is not in g (g lies past the rank's position)
                if g.text == text and g.stream == stream and g.payload is None:
                    g.ranks.add(rank)
                    self._queues.setdefault(rank, collections.deque()).append(g)
                    self._move(rank, at, g)
                    return
                g = g.next
        self._seq += 1
        g = LineGroup(stream, text, {rank}, self._seq, now, payload, prev=at, next=at.next)
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
