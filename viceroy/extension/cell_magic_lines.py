"""Cells whose ``%%mesh`` / ``%%px`` line IPython would misread, said as what to do.

IPython answers ``# a comment`` then ``%%mesh`` with "Line magic function `%%mesh` not found"
(a cell magic is one only on the first line), and ``%%mesh print(rank)`` with nothing below
with "Did you mean the line magic %mesh (single %)?" (which runs no code). `check_magic_line`
runs before IPython's own transforms and raises a one-line UsageError instead.

>>> check_magic_line(["%%mesh\\n", "print(rank)\\n"])
['%%mesh\\n', 'print(rank)\\n']
"""

from __future__ import annotations

import re

from IPython.core.error import UsageError

from viceroy.extension.args import RUN_OPTIONS

_MAGIC = re.compile(r"\s*%%(mesh|px)(?![\w?])(.*)")
OPTIONS = ", ".join(RUN_OPTIONS)


def check_magic_line(lines: list[str]) -> list[str]:
    """`lines` unchanged, or a UsageError if the cell's %%mesh / %%px line is below comments,
    or has no code under it. Only comments and blank lines may come before the line looked at,
    so a ``%%mesh`` inside a string is never taken for one."""
    at = next((i for i, line in enumerate(lines) if line.strip() and not line.lstrip().startswith("#")), None)
    if at is None:
        return lines
    m = _MAGIC.match(lines[at])
    if m is None:
        return lines
    name = f"%%{m.group(1)}"
    if at > 0:
        raise UsageError(
            f"{name} must be the cell's first line (here a comment comes before it, so IPython reads it as "
            f"a line magic it does not know): move {name} to the top; comments go below it"
        )
    if not "".join(lines[at + 1 :]):  # IPython would say "Did you mean the line magic %mesh?"
        raise UsageError(
            f"{name}: the cell has no code below its first line; the ranks run the lines under "
            f"{name}, whose own line takes only options ({OPTIONS}). For one line of code: %px CODE"
        )
    return lines


check_magic_line.has_side_effects = True  # type: ignore[attr-defined]  # not in is_complete checks
