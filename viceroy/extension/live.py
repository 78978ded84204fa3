"""Shows a running mesh call in the cell: grouped lines, one progress block, rank displays.

`LiveOutput` takes runtime events (on the main thread) and writes to a `Sink`; `CellSink` is the
one that writes into the current notebook cell. `ProgressBlock` keeps the ranks' progress bars
in one display updated in place; `RankDisplays` gives each rank's displays an id, so that a
rank's updates and ``clear_output`` act on its own displays only.

>>> live = LiveOutput(ranks=[0, 1], call_id=7, sink=CellSink())
>>> live.handle({"type": "output", "rank": 0, "stream": "stdout", "text": "hi\\n", "call": 7}, now=0)
>>> live.close()            # prints "[0] hi"
"""

from __future__ import annotations

import collections
import contextlib
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from viceroy.extension.output import LineGrouper, format_line, format_progress
from viceroy.extension.terminal import Fed, RankStreams

PROGRESS_INTERVAL = 0.2  # seconds between progress block updates
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_NOTE = (
    "[viceroy] widgets made on ranks are shown as text: their state lives in the rank's "
    "process, which the notebook cannot reach\n"
)
MAX_LINES = 5000  # per cell; beyond this lines are counted, not shown (logs keep them)
GROUP_WINDOW = 0.15  # seconds a line waits for the same line from other ranks


class Sink(Protocol):
    """Where a cell's mesh output goes."""

    def write(self, stream: str, text: str) -> None: ...
    def display(
        self,
        data: dict[str, Any],
        metadata: dict[str, Any],
        display_id: str | None = None,
        update: bool = False,
    ) -> None:
        """Show a MIME bundle (with ``display_id``: one that later updates replace), or, with
        ``update``, replace the displays with that id."""
    def progress(self, text: str) -> None:
        """Show ``text`` in the progress block (made on first use, then updated in place; an
        empty text shows nothing)."""


class CellSink:
    """Writes into the running notebook cell (stdout/stderr streams, display_data)."""

    def __init__(self, flush: bool = True) -> None:
        self._handle: Any = None
        self._flush = flush  # off the main thread, only buffer: flushing waits on iopub

    def write(self, stream: str, text: str) -> None:
        out = sys.stderr if stream == "stderr" else sys.stdout
        out.write(text)
        if self._flush:
            out.flush()

    def display(
        self,
        data: dict[str, Any],
        metadata: dict[str, Any],
        display_id: str | None = None,
        update: bool = False,
    ) -> None:
        from IPython.display import publish_display_data

        if self._flush:
            sys.stdout.flush()
            sys.stderr.flush()
        transient = {"display_id": display_id} if display_id is not None else None
        publish_display_data(data=data, metadata=metadata, transient=transient, update=update)

    def progress(self, text: str) -> None:
        from IPython.display import display

        bundle = {"text/plain": text} if text else {}
        if self._handle is None:
            if self._flush:
                sys.stdout.flush()
                sys.stderr.flush()
            self._handle = display(bundle, raw=True, display_id=True)
        else:
            self._handle.update(bundle, raw=True)


def tag_display(rank: int, data: dict[str, Any], metadata: dict[str, Any]) -> tuple[dict, dict]:
    """Mark a rank's display with its rank (metadata, and the text/plain and HTML forms)."""
    data = dict(data)
    if "text/plain" in data:
        data["text/plain"] = f"[{rank}] {data['text/plain']}"
    if "text/html" in data:
        label = f'<div class="viceroy-rank" style="font-family:monospace;opacity:.7">[{rank}]</div>'
        data["text/html"] = label + str(data["text/html"])
    return data, {**metadata, "viceroy": {"rank": rank}}


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


class RankDisplays:
    """The displays ranks show in a call's cell, each published with a display_id, so a rank
    can update and clear its own.

    A cell's outputs are shared by every rank (and by the grouped lines), so a rank's
    ``clear_output`` cannot clear the cell as IPython's does. It clears the rank's own
    displays instead: at once (``wait=False``: they show nothing), or, with ``wait=True``, the
    rank's next displays replace them in place, in order; the live-plot loop
    (``clear_output(wait=True); display(fig)``) keeps one figure per rank, updated where it
    first appeared. Lines the rank printed stay, and so do displays it gave its own
    display_id (those it updates itself).

    A widget's view is dropped (its model lives in the rank's process: the front end would
    find none), its text form kept; ``note`` is told once per call.
    """

    def __init__(self, sink: Sink, note: Callable[[str], None] = lambda _: None) -> None:
        self.sink = sink
        self._note: Callable[[str], None] | None = note
        self._prefix = f"viceroy-{uuid.uuid4().hex[:8]}"  # this call's own display ids
        self._count = 0
        self._slots: dict[int, list[str]] = {}  # rank -> its displays' ids, in order
        self._used: dict[int, int] = {}  # rank -> how many of them it showed since clearing
        self._blank: set[str] = set()  # ids emptied by a clear (and not reused since)
        self._waiting: set[int] = set()  # ranks whose next display replaces their first

    def show(self, rank: int, event: dict[str, Any]) -> None:
        """A rank's display, or an update of one it gave a display_id (``update``)."""
        data = event.get("data", {})
        if WIDGET_VIEW in data:
            data = {k: v for k, v in data.items() if k != WIDGET_VIEW}
            if self._note is not None:
                self._note(WIDGET_NOTE)
                self._note = None
            if not data:
                return
        data, md = tag_display(rank, data, event.get("metadata", {}))
        if event.get("display_id") is not None:  # ranks may use the same id: one each
            own = f"viceroy-{rank}-{event['display_id']}"
            self.sink.display(data, md, display_id=own, update=bool(event.get("update")))
            return
        if rank in self._waiting:
            self._waiting.discard(rank)
            self._used[rank] = 0
        slots = self._slots.setdefault(rank, [])
        i = self._used.get(rank, 0)
        self._used[rank] = i + 1
        if i < len(slots):
            self._blank.discard(slots[i])
            self.sink.display(data, md, display_id=slots[i], update=True)
        else:
            self._count += 1
            slots.append(f"{self._prefix}-{rank}-{self._count}")
            self.sink.display(data, md, display_id=slots[-1])

    def clear(self, rank: int, wait: bool) -> None:
        """The rank's ``clear_output(wait)``."""
        if wait:  # what an earlier, longer frame left goes now; the rest when replaced
            self._empty(rank, self._used.get(rank, 0))
            self._waiting.add(rank)
        else:
            self._empty(rank, 0)
            self._used[rank] = 0
            self._waiting.discard(rank)

    def close(self) -> None:
        """The call is over: what the ranks' last frames did not replace goes."""
        for rank in self._slots:
            self._empty(rank, self._used.get(rank, 0))

    def _empty(self, rank: int, start: int) -> None:
        for display_id in self._slots.get(rank, [])[start:]:
            if display_id not in self._blank:
                self._blank.add(display_id)
                self.sink.display({}, {"viceroy": {"rank": rank}}, display_id=display_id, update=True)


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
        self._block_after: Any = None  # the line the progress block waits for (see `_take`)
        self._displays = RankDisplays(sink, note=self._note)
        self._shown = 0
        self._hidden = 0
        self._held: collections.deque[tuple[str, str]] = collections.deque()  # not yet written
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
            # queued with the rank's lines, so it keeps its place among them
            payload = (ev["kind"], ev.get("data") or {})
            self._grouper.add(ev["rank"], "display", "", now, payload=payload)
        elif kind == "rank_exit":
            self._flush_lines()
            self._emit("stderr", f"[{ev['rank']}] rank exited ({ev.get('reason', 'unknown')})")
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
        self._displays.close()
        if self._hidden:
            self._write(
                "stderr",
                f"[viceroy] {self._hidden} more lines not shown; "
                "`%mesh logs RANK` shows a rank's recent output\n",
            )
            self._hidden = 0

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
                self._emit(g.stream, format_line(g))
            if g is self._block_after:
                self._block_after = None
                self._block.place()

    def _note(self, text: str) -> None:
        """A line of ours, written now (before the display it is about)."""
        self._write("stderr", text)
        self._write_held()

    def _emit(self, stream: str, line: str) -> None:
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
