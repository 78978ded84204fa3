"""Rank-side capture of stdout/stderr at the file-descriptor level (C extensions and
subprocesses included), forwarded live, in order, and capped per call."""

from __future__ import annotations

import fcntl
import io
import os
import select
import sys
import threading
from collections.abc import Callable

Send = Callable[[str, bytes, "int | None"], None]  # (stream, data, call id)


class OutputCapture:
    """Redirects fds 1 and 2 into pipes; a reader thread forwards what arrives.

    `send(stream, data, call_id)` must be thread-safe. `limit` caps the bytes forwarded per call;
    past it the rest is dropped and a notice says how much.
    """

    def __init__(self, send: Send, limit: int, rank: int, current_call: Callable[[], int | None]) -> None:
        self._send = send
        self._limit = limit
        self._rank = rank
        self._current_call = current_call
        self._lock = threading.Lock()
        self._fds: dict[int, str] = {}
        self._sent = 0
        self._dropped = 0
        self._call: int | None = None
        for target, name in ((1, "stdout"), (2, "stderr")):
            r, w = os.pipe()
            os.dup2(w, target)
            os.close(w)
            fcntl.fcntl(r, fcntl.F_SETFL, fcntl.fcntl(r, fcntl.F_GETFL) | os.O_NONBLOCK)
            self._fds[r] = name
        sys.stdout = sys.__stdout__ = _text_stream(1)  # type: ignore[misc]
        sys.stderr = sys.__stderr__ = _text_stream(2)  # type: ignore[misc]
        threading.Thread(target=self._reader, name="viceroy-output", daemon=True).start()

    def begin_call(self, call_id: int) -> None:
        with self._lock:
            self._call, self._sent, self._dropped = call_id, 0, 0

    def end_call(self) -> None:
        """Forward everything written so far (before the call's reply goes out)."""
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        with self._lock:
            pending, _, _ = select.select(list(self._fds), [], [], 0)
            for fd in pending:
                self._read_all(fd)
            if self._dropped:
                self._notice(f"{self._dropped} more bytes of output dropped")
            self._call = None

    def _reader(self) -> None:
        fds = list(self._fds)
        while True:
            try:
                ready, _, _ = select.select(fds, [], [])
            except InterruptedError:
                continue
            with self._lock:
                for fd in ready:
                    self._read_all(fd)

    def _read_all(self, fd: int) -> None:
        while True:
            try:
                data = os.read(fd, 1 << 16)
            except BlockingIOError:
                return
            except InterruptedError:
                continue
            if not data:
                return
            self._forward(self._fds[fd], data)

    def _forward(self, stream: str, data: bytes) -> None:
        call = self._call if self._call is not None else self._current_call()
        room = self._limit - self._sent
        if room <= 0:
            self._dropped += len(data)
            return
        if len(data) > room:
            cut = cut_at(data, room, first=self._sent == 0)
            self._dropped += len(data) - cut
            if cut:
                self._send(stream, data[:cut], call)
            self._sent = self._limit
            self._notice(
                f"output of this call passed the limit of {self._limit} bytes; the rest is "
                "dropped (raise it with Mesh.local(output_limit=...), or write to a file)"
            )
            return
        self._sent += len(data)
        self._send(stream, data, call)

    def _notice(self, text: str) -> None:
        self._send("stderr", f"\n[viceroy] rank {self._rank}: {text}\n".encode(), self._call)


def cut_at(data: bytes, room: int, first: bool) -> int:
    """How much of `data` to forward when only `room` bytes are left: up to the last whole line
    that fits, so the output ends on a line the rank wrote, not on a piece of one. Only a call
    whose very first line is longer than the whole limit gets that line's first `room` bytes
    (`first`: nothing was forwarded yet), so that it shows something."""
    cut = data.rfind(b"\n", 0, room) + 1
    return cut if cut or not first else room


def _text_stream(fd: int) -> io.TextIOWrapper:
    raw = io.FileIO(fd, "w", closefd=False)
    return io.TextIOWrapper(
        io.BufferedWriter(raw), encoding="utf-8", errors="backslashreplace", line_buffering=True
    )
