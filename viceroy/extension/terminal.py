"""A rank's output stream as a terminal shows it: complete lines, and the rows still being
redrawn (``\r`` progress bars, tqdm's stacked bars with their cursor moves) as live progress.

Pure logic, no IPython: `RankStreams` turns the raw chunks each rank writes into finished lines
and progress rows, per rank and stream (`viceroy.extension.output` groups the lines by rank set).

>>> s = RankStreams()
>>> s.feed(0, "stderr", "\\r 10%").progress
{'stderr': [' 10%']}
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

# A line longer than this without a newline is shown in pieces of about this size (each a
# line), not buffered forever; the newline that ends it adds no empty line.
MAX_PARTIAL = 64_000
LIVE_TAIL = 1000  # of a line still being written, the progress block shows this much, its end


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
        """The rows a progress block shows: bars (drawn rows), ended rows still in reach, and
        the text of a line not ended yet (``print("epoch 1 ...", end="", flush=True)``, which a
        terminal shows at once; its last LIVE_TAIL characters)."""
        return [
            r.text if r.drawn or i < self.cur or len(r.text) <= LIVE_TAIL else "…" + r.text[-LIVE_TAIL:]
            for i, r in enumerate(self.rows)
            if (r.drawn or i <= self.cur) and _SGR.sub("", r.text).strip()
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
