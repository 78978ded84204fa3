"""The file objects a rank's code writes to, over its `OutputCapture`: sys.stdout and
sys.stderr (line-buffered text whose raw file queues each line, and whose explicit flush makes
the lines durable), and the fd-level writes the capture itself needs (all of it; or what fits
before a deadline)."""

from __future__ import annotations

import fcntl
import io
import os
import select
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from viceroy.runtime.output import OutputCapture


class Queued(io.RawIOBase):
    """The raw file under a rank's sys.stdout / sys.stderr (a line-buffered TextIOWrapper, so
    print() reaches it once per line): bytes into the capture's queue, in write order."""

    def __init__(self, capture: OutputCapture, stream: str, fd: int) -> None:
        self._capture = capture
        self._stream = stream
        self._fd = fd

    def write(self, data: Any) -> int:
        data = bytes(data)
        self._capture.write(self._stream, data, self._fd)
        if not data.endswith(b"\n"):  # a flush (line-buffered text reaches here by lines):
            self._capture.flush()  # e.g. a progress bar's "\r 42%"
        return len(data)

    def flush(self) -> None:
        self._capture.flush()

    def fileno(self) -> int:
        return self._fd

    def writable(self) -> bool:
        return True


class FlushedText(io.TextIOWrapper):
    """sys.stdout / sys.stderr on a rank: an explicit flush() (print(..., flush=True), logging
    after each record) puts the lines where a kill right after cannot take them."""

    capture: OutputCapture

    def flush(self) -> None:
        super().flush()
        self.capture.flush(durable=True)


def text_stream(capture: OutputCapture, stream: str, fd: int) -> io.TextIOWrapper:
    text = FlushedText(
        io.BufferedWriter(Queued(capture, stream, fd)), encoding="utf-8", errors="backslashreplace",
        line_buffering=True,
    )
    text.capture = capture
    return text


def nonblocking(fd: int) -> None:
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except InterruptedError:
            continue


def write_before(fd: int, data: bytes, deadline: float) -> bool:
    """Write `data` to the pipe `fd` in pieces the pipe has room for (a write of at most
    PIPE_BUF bytes to a pipe poll calls writable never blocks); whether all of it went before
    `deadline`."""
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    view = memoryview(data)
    while view:
        left = deadline - time.monotonic()
        if left <= 0 or not poller.poll(int(left * 1000) + 1):
            return False
        try:
            view = view[os.write(fd, view[: select.PIPE_BUF]):]
        except InterruptedError:
            continue
    return True
