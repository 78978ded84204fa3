"""What a rank says of an error its user's code raised: type, one-line summary and traceback,
with a better summary where the cause is known (``exit()`` in rank code, a task started with
no loop running, a debugger or a password prompt with no terminal, a cut torch.distributed
group)."""

from __future__ import annotations

import os
import sys
import traceback

from viceroy.runtime.execution import format_user_traceback


def described(exc: BaseException) -> tuple[str, str, str]:
    """(type name, one-line summary, traceback) of a user error; never raises, whatever the
    exception does when asked to describe itself."""
    try:
        etype, summary, tb = format_user_traceback(exc)
        return etype, explained(exc) or summary, tb
    except Exception as e:
        name = type(exc).__name__
        return name, f"{name}: (its message could not be shown: {type(e).__name__}: {e})", "".join(traceback.format_tb(exc.__traceback__))


def explained(exc: BaseException) -> str | None:
    """A better summary for errors we know the cause of: ``exit()`` in rank code, a task
    started with no loop running, a debugger or a password prompt with no terminal, a stock torch.distributed group whose connections were cut to release a
    blocked collective."""
    if isinstance(exc, SystemExit):
        code = "" if exc.code is None else repr(exc.code)
        return (f"SystemExit: exit({code}) ends only the call on a rank: the rank stays up, its state "
                "kept; to end the ranks, shut the mesh down (mesh.shutdown(), %mesh down)")
    if type(exc) is RuntimeError and str(exc) == "no running event loop":  # create_task in a sync cell
        return ("RuntimeError: no running event loop: a rank's event loop runs only while a cell awaits (a "
                "notebook's own loop always runs): give this code an `await` (e.g. `await asyncio.sleep(0)`); the "
                "tasks it starts stay on the rank's loop and run on while later cells await")
    if type(exc).__name__ == "BdbQuit" and type(exc).__module__ == "bdb":
        return ("bdb.BdbQuit: the debugger (breakpoint(), pdb.set_trace()) quit at once: ranks have no terminal "
                "to read its commands from. Print what you need to see, or see where ranks are with %mesh stacks "
                "(mesh.stacks()); to step through the code, run it on the controller")
    if isinstance(exc, EOFError) and raised_in(exc, "getpass.py"):
        return ("EOFError: getpass() on a rank: ranks have no terminal to read a password from. Pass the secret in "
                "instead: an environment variable on every rank (%mesh up --env HF_TOKEN=...), %mesh push token=..., "
                "or a file the ranks read")
    if "torch.distributed" not in sys.modules:
        return None
    from viceroy.runtime.collectives.stock import explain

    return explain(exc)


def raised_in(exc: BaseException, file: str) -> bool:
    """Whether a frame of `exc`'s traceback is in a file named `file` (a library's module)."""
    return any(os.path.basename(f.f_code.co_filename) == file for f, _ in traceback.walk_tb(exc.__traceback__))
