"""A rank's crash report: when native code crashes a rank (a segfault, an abort), Python's
faulthandler writes every thread's Python stack. It writes them into a file of the rank's own,
not into its output, which the rank's reader thread could forward half of before the process
is gone; its agent reads the file after the death and sends the report on as the rank's last
words, trimmed to what is the user's: the runtime's own threads and frames are left out, and
so is the list of extension modules. The crashing thread always stays, all of it if none of
its frames is the user's (a crash in the runtime, then, says where).
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import re
import sysconfig
from typing import IO, Any

_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+ (\(most recent call first\)|\[.*\]).*:$")
_FRAME = re.compile(r'^  File "(?P<file>[^"]*)", line \d+ in ')
_PLUMBING = ("/viceroy/runtime/", "/threading.py", "<frozen ")
# Frames that are not the user's own code: a thread with nothing else is not the user's.
_NOT_USERS = (*_PLUMBING, "/site-packages/", "/dist-packages/", sysconfig.get_paths()["stdlib"] + "/")
_kept: list[IO[Any]] = []  # the open report file: faulthandler writes to its descriptor


def enable(path: str | None) -> None:
    """In the rank: crash reports go to `path` (to stderr when None). A process the rank's
    code forks (a data loader's worker) reports on its stderr, which the rank forwards: the
    file is read only when the rank itself dies."""
    try:
        f = open(path, "w") if path is not None else None  # noqa: SIM115 (open for the process's life)
    except OSError:  # (its directory gone, no descriptors left): stderr, as before
        f = None
    if f is None:
        faulthandler.enable(file=2, all_threads=True)
        return
    _kept.append(f)
    faulthandler.enable(file=f, all_threads=True)
    os.register_at_fork(after_in_child=_to_stderr)


def _to_stderr() -> None:
    faulthandler.enable(file=2, all_threads=True)


def take(path: str, limit: int) -> str:
    """In the agent, after the rank died: its trimmed report ("" if it wrote none); the file
    goes."""
    try:
        with open(path, "rb") as f:
            text = f.read(limit).decode(errors="replace")
    except OSError:
        return ""
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
    return trim(text)


def trim(text: str) -> str:
    """faulthandler's report without the runtime's threads and frames (see the module's notes):
    a thread stays when one of its frames is the user's own code (not the runtime's, not an
    installed package's, not the standard library's), with every frame but the runtime's."""
    out: list[str] = []
    header: str | None = None
    frames: list[str] = []

    def end_thread() -> None:
        nonlocal header
        if header is None:
            return
        shown = [f for f in frames if not _is(f, _PLUMBING)]
        if any(not _is(f, _NOT_USERS) for f in shown):
            out.extend([header, *shown, ""])
        elif header.startswith("Current thread"):  # a crash outside user code: all of it says where
            out.extend([header, *frames, ""])
        header = None
        frames.clear()

    for line in text.splitlines():
        if _THREAD.match(line):
            end_thread()
            header = line
        elif header is not None and _FRAME.match(line):
            frames.append(line)
        else:
            end_thread()
            if line.startswith("Extension modules:") or (not line.strip() and (not out or not out[-1].strip())):
                continue
            out.append(line)
    end_thread()
    while out and not out[-1].strip():
        out.pop()
    return "\n".join(out) + "\n" if out else ""


def _is(frame_line: str, places: tuple[str, ...]) -> bool:
    m = _FRAME.match(frame_line)
    return m is not None and any(p in m.group("file") for p in places)
