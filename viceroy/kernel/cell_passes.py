"""Work IPython and ipykernel do on every cell that cannot change its result, skipped or done
once: the kernel's cost around a cell's code, which grows with the cell's text (IPython's
tokenizer over it, twice; ipykernel's hash of it, a Python step per byte) and is paid by
``a=1`` too (a compile to learn whether the cell awaits, a signature check). Each falls back to
IPython's or ipykernel's own way where what it relies on is not there.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import numpy as np


def skip_needless_passes(shell: Any) -> None:
    """All of the below, for the kernel's `shell` (once, at start)."""
    answer_sync_cells_without_compiling(shell)
    transform_without_tokenizing(shell)
    quiet_check_without_tokenizing(shell)
    memoize_signature_checks()
    hash_cells_faster()


def answer_sync_cells_without_compiling(shell: Any) -> None:
    """IPython compiles every cell once only to learn whether it awaits at top level, then
    again to run it. Only a cell whose text says ``await`` or ``async`` can: any other is
    answered at once, the rest as IPython would."""
    should_run_async = shell.should_run_async

    def fast_should_run_async(raw_cell: str, *, transformed_cell: str | None = None, preprocessing_exc_tuple: Any = None) -> bool:
        if transformed_cell is not None and "await" not in transformed_cell and "async" not in transformed_cell:
            return False
        return bool(should_run_async(raw_cell, transformed_cell=transformed_cell, preprocessing_exc_tuple=preprocessing_exc_tuple))

    shell.should_run_async = fast_should_run_async


def transform_without_tokenizing(shell: Any) -> None:
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
        if not IPYTHON_SYNTAX.search(text):
            return text
        return "".join(manager.do_token_transforms(cell_magic(lines)))

    manager.transform_cell = transform_cell


# What IPython's token transforms look for: their escapes (%, !, ?, and autocall's , ; / where
# a line starts), any of which a cell must have for one of them to apply.
IPYTHON_SYNTAX = re.compile(r"[%!?]|^[ \t]*[,;/]", re.MULTILINE)
_CELL_MAGIC_HELP = re.compile(r"%%\w+\?")  # ``%%mesh?``: IPython's help transform takes it


def quiet_check_without_tokenizing(shell: Any) -> None:
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


def memoize_signature_checks() -> None:
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


def hash_cells_faster() -> None:
    """ipykernel's cell file names (`ipykernel.compiler.get_file_name`), from `murmur2_x86`."""
    from ipykernel import compiler

    if hasattr(compiler, "murmur2_x86"):
        compiler.murmur2_x86 = murmur2_x86
