"""How messages name the files of the user's lines on the controller (where a tensor op was
issued): as the file's name, unless the notebook side says otherwise. A kernel's cells are
files such as /tmp/ipykernel_1234/4025209863.py, which the notebook shows nowhere; it names them
"Cell In[5]", as its tracebacks do (`viceroy.extension`), in the ranks' tracebacks too; code a
cell sends to the ranks is named so there as well (`CellCode`)."""

from __future__ import annotations

import re
from collections.abc import Callable

SHOWN: dict[str, str] = {}  # file -> how messages name it (read on every op: a dict lookup)
_namer: Callable[[str], str | None] | None = None


def name_files(namer: Callable[[str], str | None] | None) -> None:
    """Name files ``namer(file)`` from now on (None: the file itself); forgets the names given so
    far (a kernel calls it before each cell: the same code run again is another cell)."""
    global _namer
    _namer = namer
    SHOWN.clear()


def shown(file: str) -> str:
    """How messages name `file` (kept in SHOWN)."""
    name = (_namer(file) if _namer is not None else None) or file
    if len(SHOWN) > 4096:
        SHOWN.clear()
    SHOWN[file] = name
    return name


class CellCode(str):
    """Code for `Mesh.run` that names its frames as the notebook names the cell it came from
    (``Cell In[5]``) instead of ``<mesh-cell-N>``, in the ranks' tracebacks and stacks. The name
    must be the code's own: linecache shows a frame's lines by it."""

    filename: str

    def __new__(cls, text: str, filename: str) -> CellCode:
        code = super().__new__(cls, text)
        code.filename = filename
        return code


CELL_NAME = re.compile(r"Cell In\[\d+\]\Z")  # IPython's name for a cell's frames
_FRAME = re.compile(r'File "([^"\n]+)", line (\d+)')


def in_traceback(text: str) -> str:
    """`text` with its frames' files named as messages name them: ``File "/tmp/ipykernel_1/2.py",
    line 3, in f`` -> ``Cell In[5], line 3, in f`` (as IPython shows its cells' frames)."""
    if 'File "' not in text:
        return text

    def named(m: re.Match[str]) -> str:
        if CELL_NAME.match(m[1]):  # code a notebook cell sent to the ranks (CellCode)
            return f"{m[1]}, line {m[2]}"
        if _namer is None:
            return m[0]
        name = SHOWN.get(m[1]) or shown(m[1])
        return m[0] if name == m[1] else f"{name}, line {m[2]}"

    return _FRAME.sub(named, text)
