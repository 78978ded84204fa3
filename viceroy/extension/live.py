"""Shows a running mesh call in the cell: grouped lines, one progress block, rank displays.

`LiveOutput` takes runtime events (on the main thread) and writes to a `Sink` (see
`displays`: `CellSink` writes into the current notebook cell). `ProgressBlock` keeps the ranks'
progress bars in one display updated in place; `displays.RankDisplays` keeps each rank's
displays apart. Displays a rank makes after the call's code (the figures it left open) are
shown at the call's end, in rank order.

>>> live = LiveOutput(ranks=[0, 1], call_id=7, sink=CellSink())
>>> live.handle({"type": "output", "rank": 0, "stream": "stdout", "text": "hi\\n", "call": 7}, now=0)
>>> live.close()            # prints "[0] hi"
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from viceroy.extension.displays import RankDisplays, Sink
from viceroy.extension.output import LineGroup, LineGrouper, format_line, format_progress
from viceroy.extension.terminal import Fed, RankStreams

PROGRESS_INTERVAL = 0.2  # seconds between progress block updates
MAX_LINES = 5000  # per cell; beyond this lines are counted, not shown (logs keep them)
# A rank's own notices (output dropped past its limit) start so; they are shown past MAX_LINES.
NOTICE = "[viceroy] rank "
GROUP_WINDOW = 0.15  # seconds a line waits for the same line from other ranks


class ProgressBlock:
    """A call's running progress bars (each rank stream's rows still being redrawn), in one
    display updated in place at most every PROGRESS_INTERVAL seconds.

    It stays where the first bar appeared: a notebook shows a cell's first 50 outputs and
    folds the rest, so one block is visible however long the loop (a block per bar would push
    the running one out of sight). A finished bar is an ordinary line of the cell; while no bar
    runs the block shows nothing. It is first drawn once `place`d: after the lines its rank
    printed before the bar, which may still wait to be grouped with other ranks'.
    """

    def __init__(self, sink: Sink, before_draw: Callable[[], None] = lambda: None) -> None:
        self.sink = sink
        self._before_draw = before_draw  # writes what the cell must show above a new block
        self._rows: dict[tuple[int, str], list[str]] = {}  # (rank, stream) -> its live rows
        self.placed = False  # the lines before the first bar are out: the block may be drawn
        self._shown = False  # the block exists
        self._dirty = False
        self._drawn_at = float("-inf")

    def rows(self, rank: int, stream: str, rows: list[str]) -> None:
        """The live rows of a rank's stream now (none: its bars finished or were erased)."""
        if rows:
            self._rows[(rank, stream)] = rows
        else:
            self._rows.pop((rank, stream), None)
        self._dirty = self._shown or bool(self._rows)

    def place(self) -> None:
        """The lines printed before the first bar are written: the block can go below them."""
        self.placed = True

    def tick(self, now: float) -> None:
        """Draw the block, if due at ``now``."""
        if self._dirty and self.placed and now - self._drawn_at >= PROGRESS_INTERVAL:
            self._dirty = False
            self._drawn_at = now
            shown: dict[int, list[str]] = {}
            for (rank, _), rows in sorted(self._rows.items()):
                shown.setdefault(rank, []).extend(rows)
            self._before_draw()
            self.sink.progress(format_progress(shown))
            self._shown = True

    def next_due(self) -> float | None:
        """When `tick` has something to draw, or None."""
        return self._drawn_at + PROGRESS_INTERVAL if self._dirty and self.placed else None

    def close(self) -> None:
        """The call is over: bars still running show their last state."""
        self.tick(float("inf"))


class LiveOutput:
    """Renders one call's events: lines grouped by rank set, progress, displays, exits."""

    def __init__(
        self,
        ranks: Sequence[int],
        call_id: int | None,
        sink: Sink,
        window: float = GROUP_WINDOW,
        max_lines: int = MAX_LINES,
    ) -> None:
        self.call_id = call_id
        self.sink = sink
        self.max_lines = max_lines
        self.finished = False  # the runtime said the call finished
        self._streams = RankStreams()
        self._grouper = LineGrouper(ranks, window)
        self._block = ProgressBlock(sink, before_draw=self._write_held)
        self._block_after: LineGroup | None = None  # the line the progress block waits for (see `_take`)
        self._displays = RankDisplays(sink, note=self._note)
        self._shown = 0
        self._hidden = 0
        self._held: collections.deque[tuple[str, str]] = collections.deque()  # not yet written
        self._at_end: list[tuple[int, dict[str, Any]]] = []  # (rank, display) for the call's end
        self._batching = 0  # depth of `batch` blocks: while > 0, lines are held

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Lines emitted inside are written at the end, one write per run of lines of one
        stream, in order (stdout and stderr lines keep their order); a display or a progress
        update writes the lines before it first. A cell's sink sends each write as one
        message, so a flood costs a message per round of events, not per line."""
        self._batching += 1
        try:
            yield
        finally:
            self._batching -= 1  # first: an interrupt while writing must not leave us batching
            if not self._batching:
                self._write_held()

    # --- events ------------------------------------------------------------------------------

    def handle(self, ev: dict[str, Any], now: float) -> None:
        kind = ev.get("type")
        if kind in ("output", "publish", "rank_done", "ranks_done", "call_finished") and ev.get("call") not in (
            None,
            self.call_id,
        ):
            return
        if kind == "output":
            self._output(ev["rank"], ev.get("stream", "stdout"), ev.get("text", ""), now)
        elif kind == "publish" and ev.get("kind") in ("display", "clear_output"):
            data = ev.get("data") or {}
            if data.get("end_of_call"):  # shown at the end, in rank order (see `_close`)
                self._at_end.append((ev["rank"], data))
            else:  # queued with the rank's lines, so it keeps its place among them
                self._grouper.add(ev["rank"], "display", "", now, payload=(ev["kind"], data))
        elif kind == "rank_exit":
            self._flush_lines()
            self._emit("stderr", f"[{ev['rank']}] rank exited ({ev.get('reason', 'unknown')})", ours=True)
        elif kind == "rank_done":
            self._grouper.rank_done(ev["rank"])
        elif kind == "ranks_done":
            for r in ev["ranks"]:
                self._grouper.rank_done(r)
        elif kind == "call_finished":
            self.finished = True
        self.tick(now)

    def _output(self, rank: int, stream: str, text: str, now: float) -> None:
        self._take(rank, self._streams.feed(rank, stream, text), now)

    def _take(self, rank: int, fed: Fed, now: float) -> None:
        for stream, line in fed.lines:  # a finished bar too: the line it ended on
            self._grouper.add(rank, stream, line, now)
        for stream, rows in fed.progress.items():
            self._block.rows(rank, stream, rows)
            if rows and not self._block.placed and self._block_after is None:
                # The block's place: after this rank's lines so far, once they are out.
                self._block_after = self._grouper.last_pending(rank)
                if self._block_after is None:
                    self._block.place()

    # --- time --------------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Emit what is due at ``now``."""
        self._write_groups(self._grouper.ready(now))
        self._block.tick(now)

    def next_wakeup(self, now: float) -> float:
        """Seconds until something is due (capped, so interrupts and completion are seen)."""
        due = [0.05]
        deadline = self._grouper.next_deadline()
        if deadline is not None:
            due.append(deadline - now)
        block = self._block.next_due()
        if block is not None:
            due.append(block - now)
        return max(0.0, min(due))

    def close(self) -> None:
        """The call is over: show everything still pending."""
        with self.batch():
            self._close()

    def _close(self) -> None:
        self._flush_lines()
        for rank, fed in self._streams.flush().items():
            self._take(rank, fed, 0.0)  # unfinished lines too; running bars stay in the block
        self._flush_lines()
        self._block.close()
        self._show_at_end()
        self._displays.close()
        if self._hidden:
            self._write(
                "stderr",
                f"[viceroy] {self._hidden} more lines not shown; "
                "`%mesh logs RANK` shows a rank's recent output\n",
            )
            self._hidden = 0

    def _show_at_end(self) -> None:
        """The displays ranks made after the call's code (the figures it left open, as the
        inline backend shows a cell's): below everything else, in rank order, each rank's in
        its own order. A rank sends them when it finishes, and ranks finish in any order: the
        controller, which alone sees them all, orders them, here, and holds nothing else."""
        shown, self._at_end = sorted(self._at_end, key=lambda item: item[0]), []
        for rank, event in shown:
            self._write_held()
            self._displays.show(rank, event)

    # --- writing -----------------------------------------------------------------------------

    def _flush_lines(self) -> None:
        self._write_groups(self._grouper.drain())

    def _write_groups(self, groups: list[Any]) -> None:
        for g in groups:
            if g.payload is not None:
                (rank,) = g.ranks
                kind, event = g.payload
                self._write_held()
                if kind == "display":
                    self._displays.show(rank, event)
                else:
                    self._displays.clear(rank, bool(event.get("wait")))
            else:
                ours = g.stream == "stderr" and g.text.startswith(NOTICE)
                self._emit(g.stream, format_line(g), ours=ours)
            if g is self._block_after:
                self._block_after = None
                self._block.place()

    def _note(self, text: str) -> None:
        """A line of ours, written now (before the display it is about)."""
        self._write("stderr", text)
        self._write_held()

    def _emit(self, stream: str, line: str, ours: bool = False) -> None:
        """Write a line, unless the cell has shown `max_lines`: then count it. Lines of `ours`
        (a rank exited; a rank dropped output past its limit) are always written: the count
        of lines not shown must not hide that they are not in the logs either."""
        if ours:
            self._write(stream, line + "\n")
            return
        if self._shown >= self.max_lines:
            self._hidden += 1
            return
        self._shown += 1
        self._write(stream, line + "\n")

    def _write(self, stream: str, text: str) -> None:
        self._held.append((stream, text))
        if not self._batching:
            self._write_held()

    def _write_held(self) -> None:
        """Write the held lines, a run of one stream at a time. A run leaves the queue before
        it is written, so an interrupt (Ctrl-C lands where the sink waits) neither repeats it
        nor loses what follows: that is written next time."""
        held = self._held
        while held:
            stream = held[0][0]
            run: list[str] = []
            while held and held[0][0] == stream:
                run.append(held.popleft()[1])
            self.sink.write(stream, "".join(run))
