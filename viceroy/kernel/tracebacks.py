"""Errors from Python API calls in a cell (`viceroy.MeshError`, interrupts while waiting on the
mesh) show the user's frames and the grouped rank failures, not the runtime's internal frames."""

from __future__ import annotations

import asyncio
import gc
import os
import types
from typing import Any

import IPython.core.interactiveshell

import viceroy

_PACKAGE_DIR = os.path.dirname(os.path.abspath(viceroy.__file__)) + os.sep
_IPYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(IPython.core.interactiveshell.__file__))) + os.sep


def user_frames_only(tb: types.TracebackType | None) -> types.TracebackType | None:
    """The traceback cut where it enters the viceroy package (what lies below is plumbing)."""
    kept: list[types.TracebackType] = []
    while tb is not None:
        if os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_PACKAGE_DIR):
            break
        kept.append(tb)
        tb = tb.tb_next
    new: types.TracebackType | None = None
    for t in reversed(kept):
        new = types.TracebackType(new, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return new


# What an async cell the user interrupts is cancelled with (see ViceroyKernel._cancel_on_sigint):
# the CancelledError that ends it is shown as the KeyboardInterrupt it stands for.
INTERRUPTED = "interrupted while the cell awaited"


def install_mesh_error_rendering(shell: Any) -> None:
    """Make ``shell`` render MeshErrors compactly (ours to do: the kernel owns its shell)."""

    def handler(
        shell: Any, etype: type, value: BaseException, tb: Any, tb_offset: Any = None
    ) -> list[str]:
        if isinstance(value, asyncio.CancelledError) and value.args[:1] == (INTERRUPTED,):
            etype, value = KeyboardInterrupt, KeyboardInterrupt(INTERRUPTED)
        render = getattr(value, "_render_traceback_", None)
        if render is not None:
            stb = list(render())
        else:
            stb = list(
                shell.InteractiveTB.structured_traceback(
                    etype, value, user_frames_only(tb), tb_offset=tb_offset
                )
            )
        shell._showtraceback(etype, value, stb)  # IPython leaves showing it to the handler
        return stb

    # KeyboardInterrupt / CancelledError: an interrupted wait on the mesh ends inside our
    # Future; show the user's frames only.
    shell.set_custom_exc((viceroy.MeshError, KeyboardInterrupt, asyncio.CancelledError), handler)


def release_failed_cells(shell: Any) -> None:
    """Free what a failed cell's frames hold as soon as the next failure replaces it.

    IPython's ``run_code`` keeps the cell's ExecutionResult in a local; the result holds the
    exception, whose traceback starts at that very frame: a reference cycle per failed cell,
    freed only by a full garbage collection (rare in a kernel with torch imported). Until then
    every MeshTensor in the failed frames stays alive, and so does its tensor on every rank
    (and any other object those frames hold): one set per failed cell.
    The finished ``run_code`` frame's locals are IPython's, not the user's: clearing them
    breaks the cycle; the user's frames stay whole for ``%debug`` (sys.last_traceback).
    IPython's traceback formatting (stack_data) leaves cycles of its own holding the frames it
    showed (a shape error from the tensor engine: 2 tensors per failed cell); those are
    young, and a collection of the young generations (well under a millisecond) frees them."""

    def release(result: Any = None) -> None:
        exc = getattr(result, "error_in_exec", None)
        tb = getattr(exc, "__traceback__", None)
        while tb is not None and not tb.tb_frame.f_code.co_filename.startswith(_IPYTHON_DIR):
            tb = tb.tb_next
        while tb is not None and tb.tb_frame.f_code.co_filename.startswith(_IPYTHON_DIR):
            if tb.tb_frame.f_code.co_name == "run_code":
                try:
                    tb.tb_frame.clear()
                except RuntimeError:  # still executing (a nested run_cell): leave it
                    pass
            tb = tb.tb_next
        if exc is not None:
            # IPython's traceback formatting (stack_data) leaves cycles holding the frames it
            # showed; they are young yet: a collection of the young generations is cheap.
            gc.collect(1)

    shell.events.register("post_run_cell", release)
