"""Running user code on a rank: code strings with a trailing expression, functions, async code,
and tracebacks that show the user's lines and none of ours."""

from __future__ import annotations

import ast
import asyncio
import io
import linecache
import os
import re
import sys
import threading
import tokenize
import traceback
from collections import OrderedDict
from collections.abc import Callable, Mapping
from functools import lru_cache
from types import CodeType, CoroutineType, FrameType
from typing import Any

_RUNTIME_DIR = os.path.dirname(os.path.abspath(__file__))
# The event loop's entry, where the runtime runs an async cell (`_await_if_needed`): plumbing
# between the runtime's frames and the user's, left out as the runtime's are.
_LOOP_ENTRY = (asyncio.base_events.__file__, "run_until_complete")
_TOP_LEVEL_AWAIT = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT


def check_syntax(source: str, filename: str) -> None:
    """Raise SyntaxError on the controller, before anything is sent."""
    _compile(source, filename)


_UNNAMED = "<cell>"
_KEPT = 256  # texts compiled, kept


@lru_cache(maxsize=_KEPT)
def _compile(source: str, filename: str) -> tuple[CodeType, CodeType | None]:
    """`source` compiled (its trailing expression apart), its code named `filename`. A text is
    compiled once whatever it is named (a notebook names each run of a cell anew, "Cell In[7]";
    compiling costs ~30 us for a line, far more for a cell, naming it ~2 us)."""
    try:
        body, last = compile_text(source)
    except SyntaxError as e:
        e.filename = filename
        raise
    return with_filename(body, filename), None if last is None else with_filename(last, filename)


_texts: OrderedDict[str, tuple[CodeType, CodeType | None]] = OrderedDict()  # the last used last
_texts_lock = threading.Lock()


def compile_text(source: str, shipped: Callable[[], tuple[CodeType, CodeType | None]] | None = None
                 ) -> tuple[CodeType, CodeType | None]:
    """`source` compiled as a cell: its body, and its trailing expression apart (None when it
    has none, or a final ``;`` silences it); the code is named "<cell>". The last texts used are
    kept. `shipped`: gives the same compiled by the controller (see compiled.py), taken instead
    of compiling where the text is not kept already."""
    with _texts_lock:
        codes = _texts.get(source)
        if codes is not None:
            _texts.move_to_end(source)
            return codes
    codes = shipped() if shipped is not None else _compile_text(source)
    with _texts_lock:
        _texts[source] = codes
        if len(_texts) > _KEPT:
            _texts.popitem(last=False)
    return codes


def _compile_text(source: str) -> tuple[CodeType, CodeType | None]:
    filename = _UNNAMED
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
    """Runs code and calls in one persistent namespace, with one event loop for async code.

    Async code runs as a task on that loop, kept between calls (tasks a call starts go on
    while later calls await). When the call is interrupted (or times out, which interrupts it)
    while it awaits, the task is cancelled there and then: its ``except CancelledError`` and
    ``finally`` run before the call ends, and nothing of it runs later. A task whose cleanup
    does not end when interrupted again is abandoned with its loop (the next async call gets a
    new one), never resumed in a later call.
    """

    def __init__(self, namespace: dict[str, Any]) -> None:
        self.namespace = namespace
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None  # the running call's, while it awaits
        self._abandoned: list[asyncio.AbstractEventLoop] = []  # kept: never collected, never run

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
        if not isinstance(value, CoroutineType):  # inspect.iscoroutine, without a Python call
            return value
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        loop = self._loop
        task = self._task = loop.create_task(value)
        try:
            return loop.run_until_complete(task)
        except BaseException as exc:
            if task.done():
                raise
            # Interrupted in the loop's wait, outside the user's code: cancel it there, and let
            # the traceback (which says where the call stopped) run through the user's lines.
            cancelled = self._cancel(loop, task)
            raise exc.with_traceback(cancelled.__traceback__ if cancelled is not None else exc.__traceback__) from None
        finally:
            self._task = None

    def _cancel(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> BaseException | None:
        """Cancel `task` and run its cleanup now; the CancelledError that came out of it (its
        traceback goes through the user's code), if it ended that way."""
        task.cancel()
        ended: BaseException | None = None
        try:
            loop.run_until_complete(task)
        except asyncio.CancelledError as e:
            ended = e
        except BaseException:  # its cleanup failed, or was interrupted in turn
            pass
        if not task.done():
            self._abandoned.append(loop)
            self._loop = None
        return ended

    def awaiting(self) -> list[FrameType]:
        """The frames of the code the running call awaits in, outermost first (empty when it
        does not await): what a stack dump of the thread cannot show, as the loop runs there."""
        task = self._task
        frames: list[FrameType] = []
        aw: Any = task.get_coro() if task is not None else None
        if getattr(aw, "cr_running", False):  # running, not waiting: the thread's stack shows it
            return frames
        while aw is not None and len(frames) < 200:
            frame = getattr(aw, "cr_frame", None) or getattr(aw, "gi_frame", None) or getattr(aw, "ag_frame", None)
            if frame is None:
                break
            frames.append(frame)
            aw = getattr(aw, "cr_await", None) or getattr(aw, "gi_yieldfrom", None) or getattr(aw, "ag_await", None)
        return frames


def format_user_traceback(exc: BaseException) -> tuple[str, str, str]:
    """-> (exception type name, one-line summary, traceback text without runtime frames).

    An exception of a type marked ``says_all`` (the tensor engine's `OpFailed`: its message
    names the op, the controller line that issued it and why) reads as its message alone: its
    first line, then the rest and its cause's traceback where that shows frames of its own."""
    if getattr(type(exc), "says_all", False):
        first, _, rest = str(exc).strip().partition("\n")
        tb = format_user_traceback(exc.__cause__)[2] if exc.__cause__ is not None else ""
        if "\n  File " not in tb:  # the cause's message alone: the first line says it already
            tb = ""
        return type(exc).__name__, first, "\n".join(p for p in (rest, tb) if p)
    te = traceback.TracebackException(type(exc), exc, exc.__traceback__, compact=True)
    seen: set[int] = set()
    stack: traceback.TracebackException | None = te
    while stack is not None and id(stack) not in seen:
        seen.add(id(stack))
        frames = [f for f in stack.stack if not f.filename.startswith(_RUNTIME_DIR)]
        if frames and (frames[0].filename, frames[0].name) == _LOOP_ENTRY:
            del frames[0]
        stack.stack = traceback.StackSummary.from_list(frames)
        stack = stack.__cause__ or stack.__context__
    text = _OWN_MODULE.sub(r"\1", "".join(te.format()))
    return type(exc).__name__, _OWN_MODULE.sub(r"\1", _summary(te, exc)), text


# Exception classes defined on a rank live in its namespace's module ("__mesh__"); named as in
# a script's __main__ or a notebook, without it.
_OWN_MODULE = re.compile(r"^(\s*)__mesh__\.", re.MULTILINE)


def _summary(te: traceback.TracebackException, exc: BaseException) -> str:
    """One line: ``ValueError: shape mismatch: ...``, the first line of the message (a
    SyntaxError's last, after the line and caret it shows), never a note added to it."""
    lines = "".join(te.format_exception_only()).strip().splitlines()
    if isinstance(exc, SyntaxError):
        return lines[-1]
    try:
        message = str(exc).strip()
    except Exception:  # a broken __str__: format_exception_only said so already
        message = ""
    more = "\n" in message or bool(getattr(exc, "__notes__", None))
    return lines[0] + (" ..." if more and not lines[0].endswith("...") else "")


def user_location(exc: BaseException) -> str:
    """Where user code was when `exc` hit: ``<mesh-cell-3>, line 2: time.sleep(60)``, the
    user's innermost line; when a library was running below it, where in the library too:
    ``<mesh-cell-2>, line 1: dist.barrier() (in torch/distributed/distributed_c10d.py, line 4871)``."""
    frames = list(traceback.extract_tb(exc.__traceback__))
    # Below the runtime's frames that ran the user's code, the user's; below those, a call into
    # the runtime (a vr. collective waiting, in threading.py say) is not where the user was.
    ours = [not f.filename.startswith(_RUNTIME_DIR) for f in frames]
    start = ours.index(True) if True in ours else len(frames)
    end = ours.index(False, start) if False in ours[start:] else len(frames)
    frames = frames[start:end]
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
