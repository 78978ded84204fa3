"""What an endpoint prints belongs to the call that ran it.

A rank captures output at the file-descriptor level and tags it with the call its main
thread runs; actors run on threads of their own, so their lines would come untagged and show up
in whatever cell runs next. While an endpoint runs, a context variable holds its call id, and
Python-level writes from it go out tagged with that id, line by line (asyncio tasks copy the
context, so overlapping concurrent endpoints stay apart). Everything else goes to the original
stream, as before.
"""

from __future__ import annotations

import contextvars
import sys
from collections.abc import Callable
from typing import Any

current_call: contextvars.ContextVar[int | None] = contextvars.ContextVar("viceroy_actor_call", default=None)
_pending: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar("viceroy_actor_out", default=None)

Send = Callable[[str, bytes, "int | None"], None]


class _Routed:
    def __init__(self, name: str, inner: Any, send: Send) -> None:
        self._name = name
        self._inner = inner
        self._send = send

    def write(self, text: str) -> int:
        call = current_call.get()
        buf = _pending.get()
        if call is None or buf is None:
            return int(self._inner.write(text))
        whole, _, rest = (buf.get(self._name, "") + text).rpartition("\n")
        buf[self._name] = rest
        if whole:
            self._send(self._name, (whole + "\n").encode("utf-8", "backslashreplace"), call)
        return len(text)

    def flush(self) -> None:
        self._inner.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def install(send: Send) -> None:
    """Route endpoint output through `send(stream, data, call_id)` (once per process)."""
    if not isinstance(sys.stdout, _Routed):
        sys.stdout = _Routed("stdout", sys.stdout, send)
    if not isinstance(sys.stderr, _Routed):
        sys.stderr = _Routed("stderr", sys.stderr, send)


def begin(call_id: int) -> None:
    """In the context that runs the endpoint: its output is tagged `call_id`."""
    current_call.set(call_id if call_id > 0 else None)  # one-way calls (ids <= 0): untagged, as before
    _pending.set({})


def end(send: Send) -> None:
    """Send what is left of a last line without newline (before the call's result goes)."""
    call, buf = current_call.get(), _pending.get()
    if call is not None and buf:
        for stream, rest in buf.items():
            if rest:
                send(stream, rest.encode("utf-8", "backslashreplace"), call)
        buf.clear()
