"""`ViceroyKernel`: ipykernel's IPython kernel, plus the %mesh magics and a mesh to drive.

Ordinary cells run on the controller exactly as in the stock Python kernel. The kernel loads the
Viceroy extension at start (no mesh until ``%mesh up``), stops the mesh when it shuts down or
restarts, and makes interrupts reach the ranks quickly in async cells too.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import inspect
import re
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
from ipykernel.ipkernel import IPythonKernel
from traitlets import Float

import viceroy
from viceroy.extension import current_session, session_for
from viceroy.extension.session import MeshSession
from viceroy.kernel.iostream import batch_history_writes, bound_output_history, wake_iopub_once
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


def _answer_sync_cells_without_compiling(shell: Any) -> None:
    """IPython compiles every cell once only to learn whether it awaits at top level, then
    again to run it. Only a cell whose text says ``await`` or ``async`` can: any other is
    answered at once, the rest as IPython would."""
    should_run_async = shell.should_run_async

    def fast_should_run_async(raw_cell: str, *, transformed_cell: str | None = None, preprocessing_exc_tuple: Any = None) -> bool:
        if transformed_cell is not None and "await" not in transformed_cell and "async" not in transformed_cell:
            return False
        return bool(should_run_async(raw_cell, transformed_cell=transformed_cell, preprocessing_exc_tuple=preprocessing_exc_tuple))

    shell.should_run_async = fast_should_run_async


def _transform_without_tokenizing(shell: Any) -> None:
    """IPython runs its tokenizer (pure Python: ~0.8 ms for a 40-line cell) over every cell,
    looking for its own syntax in it (``x = %magic``, ``x = !cmd``, ``%magic``, ``!cmd``,
    ``obj?``, autocall's ``/f x``), and over the call ``get_ipython().run_cell_magic(name, line,
    body)`` a ``%%magic`` cell becomes, which has none. Two kinds of cells skip it: a cell magic
    (its call at once), and a cell where none of that syntax can be, with no ``%``, ``!`` or
    ``?`` anywhere and no line starting with ``,``, ``;`` or ``/``. Any other cell is transformed
    as IPython would; the cleanup transforms (Viceroy's auto mode among them) run on every cell
    first, and a shell given transforms of its own transforms IPython's way throughout."""
    manager = shell.input_transformer_manager
    transform = manager.transform_cell
    from IPython.core.inputtransformer2 import TransformerManager, cell_magic

    ipythons_tokens = list(TransformerManager().token_transformers)

    def transform_cell(cell: str) -> str:
        if manager.line_transforms != [cell_magic] or manager.token_transformers != ipythons_tokens:
            return str(transform(cell))
        lines = (cell if cell.endswith("\n") else cell + "\n").splitlines(keepends=True)
        for cleanup in manager.cleanup_transforms:
            lines = cleanup(lines)
        if lines and lines[0].startswith("%%") and not _CELL_MAGIC_HELP.match(lines[0]):
            return "".join(cell_magic(lines))
        text = "".join(lines)
        if not _IPYTHON_SYNTAX.search(text):
            return text
        return "".join(manager.do_token_transforms(cell_magic(lines)))

    manager.transform_cell = transform_cell


# What IPython's token transforms look for: their escapes (%, !, ?, and autocall's , ; / where
# a line starts), any of which a cell must have for one of them to apply.
_IPYTHON_SYNTAX = re.compile(r"[%!?]|^[ \t]*[,;/]", re.MULTILINE)
_CELL_MAGIC_HELP = re.compile(r"%%\w+\?")  # ``%%mesh?``: IPython's help transform takes it


def _quiet_check_without_tokenizing(shell: Any) -> None:
    """A cell whose last line has a value to show is tokenized once more, whole, by IPython's
    display hook, to learn whether it ends with a ``;`` (which silences the value): ~0.8 ms for a
    40-line cell. One without a ``;`` anywhere cannot end with one and is answered at once."""
    hook = shell.displayhook
    ends_with_semicolon = getattr(hook, "semicolon_at_end_of_expression", None)
    if ends_with_semicolon is None:
        return

    def semicolon_at_end_of_expression(expression: str) -> bool:
        return ";" in expression and bool(ends_with_semicolon(expression))

    hook.semicolon_at_end_of_expression = semicolon_at_end_of_expression


def _memoize_signature_checks() -> None:
    """ipykernel asks ``inspect.signature`` which parameters ``run_cell_async`` takes on every
    cell (tens of microseconds); the answer only changes with the function, so remember it."""
    from ipykernel import ipkernel

    inspect_params = ipkernel._accepts_parameters
    if getattr(inspect_params, "memoized", False):
        return
    memo: dict[tuple[Any, tuple[str, ...]], dict[str, bool]] = {}

    def accepts_parameters(meth: Any, param_names: list[str]) -> dict[str, bool]:
        key = (getattr(meth, "__func__", meth), tuple(param_names))
        if key not in memo:
            memo[key] = inspect_params(meth, param_names)
        return dict(memo[key])

    accepts_parameters.memoized = True  # type: ignore[attr-defined]
    ipkernel._accepts_parameters = accepts_parameters


_M = 0x5BD1E995  # murmur2's multiplier
_M32 = np.uint32(_M)


@functools.lru_cache(maxsize=256)
def murmur2_x86(data: str, seed: int) -> int:
    """ipykernel's `murmur2_x86`, the same value. ipykernel hashes every cell's text with it to
    name the file the cell is compiled under (the debugger names the cell's file alike), one
    Python step per byte: 0.4 ms for a 2 KB cell, 1.5 ms for 10 KB, each time the cell runs.
    Here the words are mixed by numpy and only the running hash is a Python step per 4 bytes
    (2 KB: 0.05 ms), and a cell run again is named at once."""
    raw = data.encode("utf8")
    length = len(raw)
    h = seed ^ length
    end = length & ~3
    if end:
        k = np.frombuffer(raw, dtype="<u4", count=end // 4) * _M32  # uint32: wraps as murmur2's
        k ^= k >> np.uint32(24)
        k *= _M32
        for word in k.tolist():
            h = ((h * _M) & 0xFFFFFFFF) ^ word
    if length & 3:
        h = ((h ^ int.from_bytes(raw[end:], "little")) * _M) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * _M) & 0xFFFFFFFF
    return h ^ (h >> 15)


def _hash_cells_faster() -> None:
    """ipykernel's cell file names (`ipykernel.compiler.get_file_name`), from `murmur2_x86`."""
    from ipykernel import compiler

    if hasattr(compiler, "murmur2_x86"):
        compiler.murmur2_x86 = murmur2_x86


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
        _answer_sync_cells_without_compiling(self.shell)
        _transform_without_tokenizing(self.shell)
        _quiet_check_without_tokenizing(self.shell)
        _memoize_signature_checks()
        _hash_cells_faster()
        self.shell.extension_manager.load_extension("viceroy")
        install_mesh_error_rendering(self.shell)
        trim_refusals(self.shell)
        release_failed_cells(self.shell)
        batch_history_writes(self.shell)
        bound_output_history(self.shell)
        if self.iopub_thread is not None:
            wake_iopub_once(self.iopub_thread)
        atexit.register(self._close_mesh)

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
