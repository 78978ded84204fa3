"""Running user code on a rank: code strings with a trailing expression, functions, async code,
and tracebacks that show the user's lines and none of ours."""

from __future__ import annotations

import ast
import asyncio
import inspect
import io
import linecache
import os
import sys
import tokenize
import traceback
from collections.abc import Callable, Mapping
from functools import lru_cache
from types import CodeType
from typing import Any

_RUNTIME_DIR = os.path.dirname(os.path.abspath(__file__))
_TOP_LEVEL_AWAIT = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT


def check_syntax(source: str, filename: str) -> None:
    """Raise SyntaxError on the controller, before anything is sent."""
    _compile(source, filename)


@lru_cache(maxsize=256)
def _compile(source: str, filename: str) -> tuple[CodeType, CodeType | None]:
    tree = ast.parse(source, filename, "exec", type_comments=False)
    last: CodeType | None = None
    if tree.body and isinstance(tree.body[-1], ast.Expr) and not _ends_with_semicolon(source):
        expr = ast.Expression(tree.body[-1].value)
        tree.body.pop()
        last = compile(expr, filename, "eval", flags=_TOP_LEVEL_AWAIT)
    body = compile(tree, filename, "exec", flags=_TOP_LEVEL_AWAIT)
    return body, last


_QUIET = {tokenize.NEWLINE, tokenize.NL, tokenize.COMMENT, tokenize.ENDMARKER, tokenize.DEDENT, tokenize.INDENT}


def _ends_with_semicolon(source: str) -> bool:
    """A trailing ``;`` silences a cell's last expression, as in IPython: ``plt.plot(x);``."""
    if ";" not in source:
        return False
    last = None
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type not in _QUIET:
                last = tok
    except (tokenize.TokenError, SyntaxError):
        return False
    return last is not None and last.type == tokenize.OP and last.string == ";"


def with_filename(code: CodeType, filename: str) -> CodeType:
    """`code` (and the code nested in it) named after `filename`. cloudpickle sends code defined
    in a notebook or a script's __main__ with its file renamed "<dynamic-code>"; putting the
    name back lets tracebacks show the user's file and line."""
    consts = tuple(with_filename(c, filename) if isinstance(c, CodeType) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def restore_filename(fn: Any, filename: str | None) -> None:
    code = getattr(fn, "__code__", None)
    if code is not None and filename and code.co_filename == "<dynamic-code>":
        fn.__code__ = with_filename(code, filename)


def register_source(filename: str, source: str) -> None:
    """Make `source` visible to tracebacks under `filename` (it exists on no disk here)."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)


_after_each_call: list[Callable[[], None]] = []


def after_each_call(hook: Callable[[], None]) -> None:
    """Run `hook` on this rank after each call's code or function, before its value is sent
    (once per hook, however often registered). The extension shows the figures a call left
    open this way, as the inline backend does. A hook that raises is reported, not the call's
    failure."""
    if hook not in _after_each_call:
        _after_each_call.append(hook)


def _run_after_call_hooks() -> None:
    for hook in list(_after_each_call):
        try:
            hook()
        except Exception as exc:
            print(f"viceroy: an after-call hook failed: {type(exc).__name__}: {exc}", file=sys.stderr)


class Executor:
    """Runs code and calls in one persistent namespace, with one event loop for async code."""

    def __init__(self, namespace: dict[str, Any]) -> None:
        self.namespace = namespace
        self._loop: asyncio.AbstractEventLoop | None = None

    def run_code(self, source: str, filename: str) -> Any:
        register_source(filename, source)
        body, last = _compile(source, filename)
        try:
            self._await_if_needed(eval(body, self.namespace))
            if last is None:
                return None
            return self._await_if_needed(eval(last, self.namespace))
        finally:
            if _after_each_call:
                _run_after_call_hooks()

    def call(self, fn: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        try:
            return self._await_if_needed(fn(*args, **kwargs))
        finally:
            if _after_each_call:
                _run_after_call_hooks()

    def _await_if_needed(self, value: Any) -> Any:
        if inspect.iscoroutine(value):
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
            return self._loop.run_until_complete(value)
        return value


def format_user_traceback(exc: BaseException) -> tuple[str, str, str]:
    """-> (exception type name, one-line summary, traceback text without runtime frames)."""
    te = traceback.TracebackException(type(exc), exc, exc.__traceback__, compact=True)
    seen: set[int] = set()
    stack: traceback.TracebackException | None = te
    while stack is not None and id(stack) not in seen:
        seen.add(id(stack))
        stack.stack = traceback.StackSummary.from_list(
            [f for f in stack.stack if not f.filename.startswith(_RUNTIME_DIR)]
        )
        stack = stack.__cause__ or stack.__context__
    text = "".join(te.format())
    return type(exc).__name__, _summary(te, exc), text


def _summary(te: traceback.TracebackException, exc: BaseException) -> str:
    """One line: ``ValueError: shape mismatch: ...``, the first line of the message (a
    SyntaxError's last, after the line and caret it shows), never a note added to it."""
    lines = "".join(te.format_exception_only()).strip().splitlines()
    if isinstance(exc, SyntaxError):
        return lines[-1]
    message = str(exc).strip()
    more = "\n" in message or bool(getattr(exc, "__notes__", None))
    return lines[0] + (" ..." if more and not lines[0].endswith("...") else "")


def user_location(exc: BaseException) -> str:
    """Where user code was when `exc` hit: ``<mesh-cell-3>, line 2: time.sleep(60)``, the
    user's innermost line; when a library was running below it, where in the library too:
    ``<mesh-cell-2>, line 1: dist.barrier() (in torch/distributed/distributed_c10d.py, line 4871)``."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(_RUNTIME_DIR)]
    if not frames:
        return ""
    mine = [f for f in frames if not _is_library(f.filename)]
    f = mine[-1] if mine else frames[-1]
    where = f"{f.filename}, line {f.lineno}" + (f": {f.line.strip()}" if f.line else "")
    inner = frames[-1]
    if inner is not f:
        where += f" (in {_short_library_path(inner.filename)}, line {inner.lineno})"
    return where


@lru_cache(maxsize=1)
def _library_dirs() -> tuple[str, ...]:
    import site
    import sysconfig

    paths = {sysconfig.get_path(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    paths.update(site.getsitepackages())
    return tuple(sorted((os.path.join(p, "") for p in paths if p), key=len, reverse=True))


def _is_library(filename: str) -> bool:
    return filename.startswith(_library_dirs())


def _short_library_path(filename: str) -> str:
    """``torch/distributed/c10d_logger.py`` for a file under site-packages (or the stdlib)."""
    for d in _library_dirs():
        if filename.startswith(d):
            return filename[len(d):]
    return filename
