"""Errors from Python API calls in a cell (`viceroy.MeshError`, interrupts while waiting on the
mesh, bad input Viceroy refused) show the user's frames and the message, not the runtime's
internal frames."""

from __future__ import annotations

import asyncio
import dis
import gc
import os
import types
from typing import Any

import IPython.core.interactiveshell

import viceroy
from viceroy.runtime.collectives.waiting import interrupts_held

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
        # An exception raised at an instruction with no line of its own (a KeyboardInterrupt can
        # be) has tb_lineno None, which the constructor refuses; -1 has it found from tb_lasti.
        lineno = t.tb_lineno
        new = types.TracebackType(new, t.tb_frame, t.tb_lasti, -1 if lineno is None else lineno)
    return new


_RAISE = dis.opmap["RAISE_VARARGS"]


def refused_by_viceroy(value: BaseException, tb: types.TracebackType | None) -> bool:
    """Whether `value` is Viceroy refusing bad input: raised by a ``raise`` statement of the
    viceroy package, with only viceroy frames between the user's call and it. An error Python
    raised inside viceroy (a bug), an ``assert``, or one from code the user handed in (whose
    frame is the innermost) is none: its whole traceback stays, to debug it."""
    if not isinstance(value, Exception) or isinstance(value, (AssertionError, SyntaxError)):
        return False
    entered = False
    while tb is not None:
        inside = os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_PACKAGE_DIR)
        if entered and not inside:
            return False
        entered = entered or inside
        if tb.tb_next is None:
            break
        tb = tb.tb_next
    if not entered or tb is None:
        return False
    code, at = tb.tb_frame.f_code.co_code, tb.tb_lasti
    return 0 <= at < len(code) - 1 and code[at] == _RAISE and code[at + 1] > 0


def trim_refusals(shell: Any) -> None:
    """Show bad input Viceroy refused (`refused_by_viceroy`) cut where the user's code called
    in: ``mesh.slice(gpu=0)`` shows the user's line and the message, not three frames of
    shape bookkeeping. ``%tb`` and ``%debug`` see the same cut traceback."""
    show = shell.showtraceback

    def showtraceback(exc_tuple: Any = None, *args: Any, **kwargs: Any) -> Any:
        try:
            etype, value, tb = shell._get_exc_info(exc_tuple)
        except ValueError:  # nothing to show: IPython says so
            return show(exc_tuple, *args, **kwargs)
        if refused_by_viceroy(value, tb):
            cut = user_frames_only(tb)
            if cut is not None:
                exc_tuple = (etype, value, cut)
        return show(exc_tuple, *args, **kwargs)

    shell.showtraceback = showtraceback


# What an async cell the user interrupts is cancelled with (see ViceroyKernel._cancel_on_sigint):
# the CancelledError that ends it is shown as the KeyboardInterrupt it stands for.
INTERRUPTED = "interrupted while the cell awaited"


def install_mesh_error_rendering(shell: Any) -> None:
    """Make ``shell`` render MeshErrors compactly (ours to do: the kernel owns its shell)."""

    def handler(
        shell: Any, etype: type, value: BaseException, tb: Any, tb_offset: Any = None
    ) -> list[str]:
        # A second Ctrl-C while the error renders (a double press) is dropped: raised in here,
        # IPython would print "Custom TB Handler failed" and drop this handler for good.
        with interrupts_held():
            return render_error(shell, etype, value, tb, tb_offset)

    def render_error(shell: Any, etype: type, value: BaseException, tb: Any, tb_offset: Any) -> list[str]:
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
