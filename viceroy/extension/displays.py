"""Where a call's output goes in the notebook cell: `Sink` (what `LiveOutput` writes to),
`CellSink` (the one that writes into the current cell), and `RankDisplays`, which gives each
rank's displays ids of their own, so that a rank's updates and ``clear_output`` act on its own
displays only.
"""

from __future__ import annotations

import contextlib
import sys
import uuid
from collections.abc import Callable, Iterator
from typing import Any, Protocol

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_NOTE = (
    "[viceroy] widgets made on ranks are shown as text: their state lives in the rank's "
    "process, which the notebook cannot reach\n"
)


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
    """Writes into the running notebook cell (stdout/stderr streams, display_data), or, given
    the ``parent`` header of another cell's request, into that cell (ipykernel sends what this
    thread writes under that header, as the output of that cell, finished or not)."""

    def __init__(self, flush: bool = True, parent: dict[str, Any] | None = None) -> None:
        self._handle: Any = None
        self._flush = flush  # off the main thread, only buffer: flushing waits on iopub
        self._parent = parent

    @contextlib.contextmanager
    def _in_cell(self) -> Iterator[None]:
        """Output made inside goes to the ``parent`` cell (when there is one, in a kernel)."""
        if self._parent is None:
            yield
            return
        shell = sys.modules["IPython"].get_ipython() if "IPython" in sys.modules else None
        targets: list[Any] = [sys.stdout, sys.stderr, getattr(shell, "display_pub", None)]
        tokens = [(t, t.set_thread_parent(self._parent)) for t in targets if hasattr(t, "set_thread_parent")]
        try:
            yield
        finally:
            for target, token in reversed(tokens):
                target.reset_thread_parent(token)

    def write(self, stream: str, text: str) -> None:
        out = sys.stderr if stream == "stderr" else sys.stdout
        with self._in_cell():
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
        with self._in_cell():
            publish_display_data(data=data, metadata=metadata, transient=transient, update=update)

    def progress(self, text: str) -> None:
        from IPython.display import display

        bundle = {"text/plain": text} if text else {}
        with self._in_cell():
            if self._handle is None:
                if self._flush:
                    sys.stdout.flush()
                    sys.stderr.flush()
                self._handle = display(bundle, raw=True, display_id=True)
            else:
                self._handle.update(bundle, raw=True)


def tag_display(rank: int, data: dict[str, Any], metadata: dict[str, Any]) -> tuple[dict, dict]:
    """Mark a rank's display with its rank: in its metadata, and in the forms a front end may
    render that can carry a label (it renders the richest: HTML, then markdown, then an image,
    then text/plain). A matplotlib figure's image has the label drawn in (`mpl_backend`); other
    images are left as they are (an HTML copy under a label would double each in the notebook)."""
    data = dict(data)
    label = f'<div class="viceroy-rank" style="font-family:monospace;opacity:.7">[{rank}]</div>'
    if "text/plain" in data:
        data["text/plain"] = f"[{rank}] {data['text/plain']}"
    if "text/html" in data:
        data["text/html"] = label + str(data["text/html"])
    if "text/markdown" in data:  # (an HTML block ends at the blank line)
        data["text/markdown"] = f"{label}\n\n{data['text/markdown']}"
    return data, {**metadata, "viceroy": {"rank": rank}}


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
        self._prefix = ""  # this call's own display ids: made at its first display (most calls show none)
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
            self._prefix = self._prefix or f"viceroy-{uuid.uuid4().hex[:8]}"
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
