"""How a failed mesh call looks in a notebook: one error output, grouped by rank set.

IPython shows an exception's ``_render_traceback_()`` lines instead of a Python traceback, so a
failing ``%%mesh`` cell shows the ranks' grouped tracebacks and none of our plumbing.

>>> lines = render_message("cell failed on 1 of 2 ranks\\nrank 1: ZeroDivisionError: division by zero")
>>> lines[1]
'\\x1b[1mrank 1\\x1b[0m: ZeroDivisionError: division by zero'
"""

from __future__ import annotations

import dataclasses
import re
from typing import TypeVar

from viceroy.runtime.errors import RankFailure

RED = "\x1b[0;31m"
BOLD = "\x1b[1m"
RESET = "\x1b[0m"
_RANK_LABEL = re.compile(r"^(ranks? [\d,\-]+)(:)")

E = TypeVar("E", bound=BaseException)


def render_message(message: str, ename: str = "MeshError") -> list[str]:
    """Traceback lines for a grouped message: a red header, then rank labels in bold."""
    first, _, rest = message.partition("\n")
    lines = [f"{RED}{ename}{RESET}: {first}"]
    for line in rest.splitlines():
        lines.append(_RANK_LABEL.sub(lambda m: f"{BOLD}{m.group(1)}{RESET}{m.group(2)}", line))
    return lines


def with_rendering(exc: E, lines: list[str]) -> E:
    """Make IPython show ``lines`` (and only them) for ``exc``."""
    exc._render_traceback_ = lambda: list(lines)  # type: ignore[attr-defined]
    return exc


# The runtime's hints name the Python API; in a magic cell, name the magic.
_MAGIC_WORDING = {"mesh.restart(failed_only=True)": "`%mesh restart --failed`", "mesh.restart()": "`%mesh restart`"}


def _in_magic_words(text: str) -> str:
    for api, magic in _MAGIC_WORDING.items():
        text = text.replace(api, magic)
    return text


def render_mesh_error(err: E) -> E:
    """Attach the grouped rendering to a `viceroy.MeshError` raised by a magic (for ``raise``),
    its hints reworded for the magic; the error's own message too, so that the reply's evalue
    (what tools such as nbclient print) says what the output says."""
    if isinstance(getattr(err, "hint", None), str):
        err.hint = _in_magic_words(err.hint)  # type: ignore[attr-defined]
    failures = getattr(err, "failures", None)
    if isinstance(failures, dict):
        for rank, f in failures.items():
            if isinstance(f, RankFailure) and _in_magic_words(f.summary) != f.summary:
                failures[rank] = dataclasses.replace(f, summary=_in_magic_words(f.summary))
    message = _in_magic_words(str(err))
    err.args = (message,)
    return with_rendering(err, render_message(message, type(err).__name__))


def interrupted_start() -> KeyboardInterrupt:
    """The exception ``%mesh up`` ends with when the user interrupts it."""
    msg = "%mesh up was interrupted; no mesh is up (run it again)"
    return with_rendering(KeyboardInterrupt(msg), [f"{RED}KeyboardInterrupt{RESET}: {msg}"])


def interrupted(ranks: str, still_running: str = "") -> KeyboardInterrupt:
    """The exception a ``%%mesh`` cell ends with when the user interrupts it; `still_running`
    names the ranks (``"1"``, ``"0-3"``) that have not stopped yet, if any."""
    msg = f"interrupted the mesh call on ranks {ranks}"
    if still_running:
        label = "rank" if still_running.isdigit() else "ranks"
        msg += (
            f"; some ranks have not stopped yet ({label} {still_running}: code that does not "
            "see the interrupt, such as os.system or a C call, is still running): `%mesh stacks` "
            "shows where they are, and the next cell waits for them"
        )
    exc = KeyboardInterrupt(msg)
    return with_rendering(exc, [f"{RED}KeyboardInterrupt{RESET}: {msg}"])


class CellSyntaxError(Exception):
    """A syntax error in code meant for the ranks; nothing was sent.

    Deliberately not a SyntaxError subclass: IPython would then print the frames of our magic.
    Its name reads "SyntaxError" in the notebook.
    """


CellSyntaxError.__name__ = CellSyntaxError.__qualname__ = "SyntaxError"


def syntax_error(err: SyntaxError, hint: str = "") -> CellSyntaxError:
    """The one-output form of a SyntaxError found in a ``%%mesh`` cell (`hint`: a line below
    it saying what to do instead)."""
    import traceback

    lines = traceback.format_exception_only(type(err), err)
    text = "".join(lines).rstrip("\n")
    body, _, last = text.rpartition("\n")
    message = last.partition(": ")[2] or last
    rendered = [*body.splitlines(), f"{RED}SyntaxError{RESET}: {message}"]
    if hint:
        rendered.append(f"{BOLD}hint{RESET}: {hint}")
        message = f"{message} ({hint})"
    exc = CellSyntaxError(message)
    return with_rendering(exc, rendered)
