"""Cheaper per-cell bookkeeping for the controller's kernel: every cell pays it, and a `%%mesh`
cell is meant to cost little more than ``a=1``.

- `OutStream`: ipykernel flushes stdout and stderr after every cell, each flush a round trip
  to its IO thread (two wake-ups and a wait), even when the cell printed nothing. This one
  returns at once when nothing is buffered or scheduled; output still goes out in order,
  because anything written has scheduled its own flush.
- `batch_history_writes`: IPython writes each cell's input to its SQLite history as the cell
  runs (a transaction per cell on a background thread). Here inputs are written at most once a
  second, and at exit; history requests write out first, so they always see every cell. IPython
  stops its saving thread around a fork (``!cmd``); the next write starts it again.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from ipykernel import iostream

HISTORY_WRITE_INTERVAL_S = 1.0
OUTPUT_HISTORY_CELLS = 200  # cells whose captured output IPython's history keeps
OUTPUT_HISTORY_CHARS = 64 * 1024  # of each captured stream run, the first kept
_CUT = "\n[viceroy: output history cut here; the notebook shows it all]\n"


class OutStream(iostream.OutStream):
    """ipykernel's stream, without the IO-thread round trip when there is nothing to send."""

    def flush(self) -> None:
        if (
            self.echo is None
            and not self._flush_pending
            and not self._subprocess_flush_pending
            and not self._buffered()
        ):
            return
        super().flush()

    def _buffered(self) -> bool:
        with self._buffer_lock:
            return any(buf.tell() for buf in self._buffers.values())


def batch_history_writes(shell: Any, interval: float = HISTORY_WRITE_INTERVAL_S) -> None:
    """Write the shell's input history at most every `interval` seconds instead of per cell."""
    hm = shell.history_manager
    if hm is None or not hm.enabled or getattr(hm, "save_thread", None) is None:
        return
    hm.db_cache_size = 1 << 30  # store_inputs never asks for a write itself
    ran = threading.Event()

    def write_out_now_and_then() -> None:
        while True:
            ran.wait()
            time.sleep(interval)
            ran.clear()  # cells from here on are in the next round (this one writes them too)
            try:
                _write_out(hm)
            except Exception as e:  # never let this thread die: history would stop being saved
                print(f"viceroy: writing the input history failed: {e!r}", file=sys.__stderr__)

    threading.Thread(target=write_out_now_and_then, name="viceroy-history", daemon=True).start()
    shell.events.register("post_run_cell", lambda *_: ran.set())


def _write_out(hm: Any) -> None:
    """Have IPython's saving thread write the cached inputs out. IPython stops that thread
    before every fork (``!cmd``, subprocesses started with fork) and starts it again only when
    its own cache fills, which ours never does: start it again here, as IPython would. Without
    a thread to ask, write the cache out on this one (IPython's connection allows any thread)."""
    if hm.save_flag is None and getattr(hm, "using_thread", False):
        restart = getattr(hm, "_restart_thread_if_stopped", None)
        if restart is not None:
            restart()
    flag = hm.save_flag
    if flag is not None:
        flag.set()
    else:
        hm.writeout_cache()


def bound_output_history(
    shell: Any, cells: int = OUTPUT_HISTORY_CELLS, chars: int = OUTPUT_HISTORY_CHARS
) -> None:
    """After each cell, cut the stream output IPython captured for it to ``chars`` characters
    per stream run, and drop what it captured (output, formatted tracebacks) for cells before
    the last ``cells``."""
    hm = shell.history_manager
    outputs = getattr(hm, "outputs", None) if hm is not None else None
    if not isinstance(outputs, dict):  # IPython < 9 keeps no copy
        return
    exceptions = getattr(hm, "exceptions", None)
    if not isinstance(exceptions, dict):
        exceptions = {}

    def trim(result: Any = None) -> None:
        count = getattr(result, "execution_count", None)  # None: a cell not stored in history
        for entry in outputs.get(shell.execution_count if count is None else count, ()):
            stream = getattr(entry, "bundle", {}).get("stream")
            if isinstance(stream, list) and (len(stream) > 1 or (stream and len(stream[0]) > chars)):
                text = "".join(stream)
                stream[:] = [text if len(text) <= chars else text[:chars] + _CUT]
        for kept in (outputs, exceptions):  # counts go in in order: the first key is the oldest
            while len(kept) > cells:
                del kept[next(iter(kept))]

    shell.events.register("post_run_cell", trim)
