"""`ViceroyKernel`: ipykernel's IPython kernel, plus the %mesh magics and a mesh to drive.

Ordinary cells run on the controller exactly as in the stock Python kernel. The kernel loads the
Viceroy extension at start (no mesh until ``%mesh up``), stops the mesh when it shuts down or
restarts, and makes interrupts reach the ranks quickly in async cells too.
"""

from __future__ import annotations

import asyncio
import atexit
import inspect
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ipykernel.ipkernel import IPythonKernel
from traitlets import Float

import viceroy
from viceroy.extension import current_session, session_for
from viceroy.extension.session import MeshSession
from viceroy.kernel.cell_passes import skip_needless_passes
from viceroy.kernel.iopub import hand_iopub_over
from viceroy.kernel.iostream import batch_history_writes, bound_output_history
from viceroy.kernel.shell_replies import send_replies_inline
from viceroy.kernel.tracebacks import (
    INTERRUPTED,
    install_mesh_error_rendering,
    release_failed_cells,
    trim_refusals,
)


def _skip_debug_records(log: Any) -> None:
    """Jupyter apps set their logger to DEBUG and filter in the handlers, so each of the
    kernel's several debug calls per message builds a LogRecord that is then thrown away. Let
    the logger drop what no handler would print (a ``--debug`` kernel still logs everything)."""
    handlers = getattr(log, "handlers", None)
    if handlers and log.level < min(h.level for h in handlers):
        log.setLevel(min(h.level for h in handlers))


async def _maybe_await(x: Any) -> Any:
    return await x if inspect.isawaitable(x) else x


class ViceroyKernel(IPythonKernel):
    """The notebook's kernel is the mesh controller."""

    implementation = "viceroy"
    implementation_version = viceroy.__version__
    banner = (
        f"Viceroy {viceroy.__version__}: Python runs here, on the controller.\n"
        "`%mesh up gpus=4` starts a mesh; a `%%mesh` cell runs on its ranks."
    )

    # ipykernel sleeps 0.5 ms after every cell before its reply (a FIXME: output that "doesn't
    # seem to make it" to clients). Output written here is flushed, synchronously, before the
    # reply, and front ends wait for the idle status that follows it on IOPub; the sleep only
    # costs every cell half a millisecond.
    _execute_sleep = Float(0.0).tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        assert self.shell is not None
        _skip_debug_records(self.log)
        self._transform_memo = threading.local()
        self.shell.transform_cell = self._transform_once(self.shell.transform_cell)
        skip_needless_passes(self.shell)
        self.shell.extension_manager.load_extension("viceroy")
        install_mesh_error_rendering(self.shell)
        trim_refusals(self.shell)
        release_failed_cells(self.shell)
        batch_history_writes(self.shell)
        bound_output_history(self.shell)
        if self.iopub_thread is not None:
            hand_iopub_over(self.iopub_thread)
        atexit.register(self._close_mesh)

    def start(self) -> None:
        super().start()
        send_replies_inline(self)  # once the shell stream reads requests

    @property
    def mesh_session(self) -> MeshSession:
        """The session holding this kernel's mesh (a new one after ``%reload_ext viceroy``)."""
        return session_for(self.shell)

    def _close_mesh(self) -> None:
        session = current_session(self.shell)
        if session is not None:
            session.close()

    async def do_execute(
        self,
        code: str,
        silent: bool,
        store_history: bool = True,
        user_expressions: dict[str, Any] | None = None,
        allow_stdin: bool = False,
        **kwargs: Any,
    ) -> Any:
        """As ipykernel's, with the cell transformed once (see `_transform_once`)."""
        memo = self._transform_memo
        memo.armed, memo.cell = True, None
        try:
            return await super().do_execute(code, silent, store_history, user_expressions, allow_stdin, **kwargs)
        finally:
            memo.armed, memo.cell = False, None

    def _transform_once(self, transform: Callable[[str], str]) -> Callable[[str], str]:
        """ipykernel transforms each cell twice: once to decide whether it runs async, then
        again inside ``run_cell``. The shell's `transform_cell` becomes this wrapper, which
        hands the second request the first's result (nothing runs in between to change it),
        saving every cell a pass of IPython's tokenizer. Per thread: subshells run cells on
        their own threads, concurrently."""
        memo = self._transform_memo

        def transform_cell(raw_cell: str) -> str:
            kept = getattr(memo, "cell", None)
            if kept is not None and kept[0] == raw_cell:
                memo.cell = None
                return kept[1]
            cell = transform(raw_cell)
            if getattr(memo, "armed", False):  # the cell's first transform: keep it once
                memo.armed, memo.cell = False, (raw_cell, cell)
            return cell

        return transform_cell

    async def do_shutdown(self, restart: bool) -> dict[str, Any]:
        """Shutdown and restart both stop the mesh and every process of it."""
        self._close_mesh()
        return await _maybe_await(super().do_shutdown(restart))

    @contextmanager
    def _cancel_on_sigint(self, future: asyncio.Future[Any]) -> Iterator[None]:
        """Interrupts in async cells: cancel the cell at once (ipykernel waits for the next
        loop wake-up, ~18 s for ``await asyncio.sleep``; ipykernel#881). Cancelling an awaited
        `viceroy.Future` interrupts its ranks."""
        loop = asyncio.get_running_loop()

        def cancel() -> None:
            if not future.done():
                future.cancel(msg=INTERRUPTED)  # shown as the KeyboardInterrupt it is

        def handle_sigint(*_: Any) -> None:
            loop.call_soon_threadsafe(cancel)
            # Also stop the mesh's calls directly: cancelling `await fut` alone does not reach
            # the ranks in this runtime version (see docs/kernel-notes.md). Off the loop thread,
            # because interrupting waits for the ranks to acknowledge.
            session = current_session(self.shell)
            if session is not None:
                threading.Thread(
                    target=session.interrupt_running, name="viceroy-interrupt", daemon=True
                ).start()

        saved = signal.signal(signal.SIGINT, handle_sigint)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, saved)
