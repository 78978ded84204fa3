"""How messages name the files of the user's lines on the controller (where a tensor op was
issued): as the file's name, unless the notebook side says otherwise. A kernel's cells are
files such as /tmp/ipykernel_1234/4025209863.py, which the notebook shows nowhere; it names them
"Cell In[5]", as its tracebacks do (`viceroy.extension`)."""

from __future__ import annotations

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
