"""On a rank, a signal handler runs where the user's code could have raised: it waits for the
message the main thread is sending, and outside the user's code its exception is told, not
raised.

Python runs a signal handler on the main thread between two bytecodes, wherever that thread is.
A rank's main thread sends its answers, displays and flushed output itself, in pieces written
from Python. A handler that raised between two pieces (a timeout through ``signal.alarm``, say)
would leave half a message on the link, and every message after it would be misread: the rank
would hang. Between calls the main thread waits in the runtime for the next call: raised there,
the exception ended the rank (that wait wakes for signals that another thread took:
`viceroy.runtime.signal_wakeup`). So on a rank ``signal.signal`` installs the handler inside a
wrapper which, while the main thread is inside a message, keeps the signal and returns; the
handler runs as soon as the message is out, with the frame the signal came in. Run outside the
user's code (between calls, or as the rank sends a call's answer), a handler that raises has its
exception printed on the rank's stderr, and the rank goes on; SystemExit still ends it (a
SIGTERM handler that exits). ``signal.getsignal`` and the value ``signal.signal`` returns give
back handlers as they were set. A handler installed past ``signal.signal`` (through
``_signal``, or in C) is not held.
"""

from __future__ import annotations

import functools
import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

Handler = Callable[[int, "FrameType | None"], Any]


class HeldSignals:
    """`sending()`: whether the main thread is inside a message now; the rank calls
    `run_held()` after each it sends, to run the handlers that waited, in order.
    `in_user_code()`: whether the main thread runs the user's code (where a handler raises)."""

    def __init__(self, rank: int, sending: Callable[[], bool], in_user_code: Callable[[], bool]) -> None:
        self._sending = sending
        self._rank = rank
        self._in_user_code = in_user_code
        self._held: list[tuple[Handler, int, FrameType | None]] = []

    def install(self) -> None:
        """Wrap the handlers set from now on (and route `signal.getsignal` around the wrappers)."""
        real_signal, real_getsignal = signal.signal, signal.getsignal

        @functools.wraps(real_signal)
        def set_handler(signalnum: int, handler: Any) -> Any:
            return _as_set(real_signal(signalnum, self._wrap(handler) if callable(handler) else handler))

        @functools.wraps(real_getsignal)
        def get_handler(signalnum: int) -> Any:
            return _as_set(real_getsignal(signalnum))

        signal.signal = set_handler
        signal.getsignal = get_handler

    def _wrap(self, handler: Handler) -> Handler:
        def held(signum: int, frame: FrameType | None) -> Any:
            if self._sending():
                self._held.append((handler, signum, frame))
                return None
            return self._run(handler, signum, frame)

        held.__viceroy_holds__ = handler  # type: ignore[attr-defined]
        return held

    def run_held(self) -> None:
        """Run the handlers whose signals came while a message was being sent (one that
        raises in the user's code ends this; those after it run after the next message)."""
        while self._held:
            handler, signum, frame = self._held.pop(0)
            self._run(handler, signum, frame)

    def _run(self, handler: Handler, signum: int, frame: FrameType | None) -> Any:
        if self._in_user_code():
            return handler(signum, frame)
        try:
            return handler(signum, frame)
        except (Exception, KeyboardInterrupt) as exc:
            print(f"[viceroy] rank {self._rank}: the {_name(signum)} handler raised {type(exc).__name__}: {exc} outside the "
                  "code of a call (between calls, or while the rank answered one); the rank goes on. A handler's "
                  "exception is raised inside a call's code only.", file=sys.stderr)
            return None


def _as_set(handler: Any) -> Any:
    """The handler as the user set it, not our wrapper around it."""
    return getattr(handler, "__viceroy_holds__", handler)


def _name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:  # a real-time signal
        return f"signal {signum}"
