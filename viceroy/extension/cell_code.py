"""The code a notebook cell sends to the ranks, named and numbered as the notebook shows the cell.

A ``%%mesh`` cell's body ran as ``<%%mesh cell 7>``, its lines counted from below the
``%%mesh`` line: a rank's traceback said ``File "<%%mesh cell 7>", line 2`` for what the
notebook shows as line 3 of cell ``[12]``. Now it says ``Cell In[12], line 3``, as IPython
names the frames of cells that run here, and a function a ``%%mesh`` cell defined is named
after that cell wherever it fails later.
"""

from __future__ import annotations

from typing import Any

from viceroy.runtime.file_names import CellCode


def cell_code(shell: Any, code: str, label: str) -> str:
    """`code` (a cell magic's body, or a line magic's code) as `CellCode` named after the cell
    running now, with blank lines before it for the cell's lines above it (the ``%%mesh`` line),
    so that line numbers are the cell's. `code` unchanged when it cannot be placed in the cell
    for certain: a cell not kept in the history (its number is not shown: the text of the last
    one kept differs), a line magic in a cell of several lines (two codes would share one name),
    or a body IPython reshaped."""
    # IPython keeps each cell's text at its number before running it (index 0 is empty).
    raw_cells = getattr(getattr(shell, "history_manager", None), "input_hist_raw", None)
    if not isinstance(raw_cells, list) or len(raw_cells) < 2 or not isinstance(raw_cells[-1], str):
        return code
    count, raw = len(raw_cells) - 1, raw_cells[-1]
    lines = raw.splitlines()
    if not label.startswith("%%"):  # a line magic: `%px CODE` alone in its cell
        if len(lines) != 1 or not lines[0].rstrip().endswith(code.strip()):
            return code
        return CellCode(code, f"Cell In[{count}]")
    first = next((i for i, line in enumerate(lines) if line.strip()), len(lines))
    above = first + 1 if first < len(lines) and lines[first].startswith("%%") else first  # auto mode: none
    if "\n".join(lines[above:]).rstrip() != code.rstrip():
        return code
    return CellCode("\n" * above + code, f"Cell In[{count}]")
