"""Rank-side capture of stdout/stderr: forwarded live, in the order it was written, and capped
per call.

Python-level writes (print, logging, warnings, tqdm) reach one in-memory queue a line at a time
(sys.stdout and sys.stderr are line-buffered), in the order the lines are written, whichever
stream they are for: a line on stderr written between two lines on stdout stays between them.
Writes at the file-descriptor level (C extensions, subprocesses, os.write, forked children) go
into a pipe per fd; before a Python-level line is queued, the queue takes what those pipes
hold, so the two kinds stay in order too.

Only the reader thread sends, never the thread that writes: that is often the rank's main
thread, where an interrupt may land at any line, and must not land inside a message half sent.
Lines go out within LINE_DELAY_S of being written (a burst of them as one message), an
unfinished line as soon as it is flushed (a progress bar's "\r 42%"), and all of it before the
call's result and before a message the rank publishes (a display; both sent by the thread that
sends that message, as the rank sends any message, whole). An explicit flush
(``print(..., flush=True)``, ``sys.stdout.flush()``, logging after each record) sends what is
queued from the flushing thread, the same way: once it returns the lines are in the link's
socket buffer, which outlives the process, so a kill right after cannot take them. An exit
(``os._exit``) writes what is queued into the fd-level pipes, which its agent reads out after
the death, and stops the reader first, which must not take it back out of them.
"""

from __future__ import annotations

import contextlib
import io
import os
import select
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import NoReturn

from viceroy.runtime.output_streams import nonblocking, text_stream, write_all, write_before

Send = Callable[[str, bytes, "int | None"], None]  # (stream, data, call id)

LINE_DELAY_S = 0.002  # a line waits at most this long for others to go out with it
MAX_QUEUED = 1 << 20  # past this many bytes waiting, writers wait for the reader (backpressure)
_FD = {"stdout": 1, "stderr": 2}


class OutputCapture:
    """Installs sys.stdout/sys.stderr and redirects fds 1 and 2 into pipes (`pipes`: fd ->
    (read end, write end) made beforehand, else new ones); a reader thread forwards both in order.

    `send(stream, data, call_id)` must be thread-safe. `limit` caps the bytes forwarded per call;
    past it the rest is dropped and a notice says how much. `sending_here()`: whether the calling
    thread is inside `send` (or another send of the process that must not be interrupted).
    """

    def __init__(
        self,
        send: Send,
        limit: int,
        rank: int,
        current_call: Callable[[], int | None],
        pipes: dict[int, tuple[int, int]] | None = None,
        sending_here: Callable[[], bool] = lambda: False,
    ) -> None:
        self._send = send
        # Whether this thread is in the middle of sending a message (a signal handler that
        # interrupted it): a flush there must not send, which would cut that message in two.
        self._sending_here = sending_here
        self._limit = limit
        self._rank = rank
        self._current_call = current_call
        # Held by whoever forwards, from taking the queue and the pipes to the last byte sent:
        # one sender at a time, in order; and what was taken is never held only in memory
        # while nobody sends it (a thread that holds it is sending, or exiting).
        # (Reentrant only so that a thread can tell it holds it: it is never taken twice.)
        self._sending = threading.RLock()
        # Held briefly, also by writers; reentrant, as a signal handler that prints may run in a
        # thread that is inside write().
        self._queue_lock = threading.RLock()
        self._drained = threading.Condition(self._queue_lock)  # writers wait here past MAX_QUEUED
        self._queue: list[tuple[str, bytearray]] = []  # (stream, data), oldest first
        self._queued = 0
        self._line_start = True  # the last byte queued ended a line (or nothing is queued)
        self._due: float | None = None  # when the queued lines must go out
        self._sent = 0
        self._dropped = 0
        self._unfinished: str | None = None  # the stream whose last forwarded line is unfinished
        self._call: int | None = None
        self._reader_ident: int | None = None
        self._fds: dict[int, str] = {}
        for target, name in ((1, "stdout"), (2, "stderr")):
            # Pipes made by the fork server, which gave their read ends to the agent too: what
            # this process wrote but never sent (it died) is still read out, by the agent.
            r, w = (pipes or {}).get(target) or os.pipe()
            os.dup2(w, target)
            os.close(w)
            nonblocking(r)
            self._fds[r] = name
        self._pipes = select.poll()
        for fd in self._fds:
            self._pipes.register(fd, select.POLLIN)
        self._wake_r, self._wake_w = os.pipe()
        nonblocking(self._wake_r)
        nonblocking(self._wake_w)
        self._forked = False
        os.register_at_fork(after_in_child=self._after_fork)
        self._streams = (text_stream(self, "stdout", 1), text_stream(self, "stderr", 2))
        sys.stdout = sys.__stdout__ = self._streams[0]  # type: ignore[misc]
        sys.stderr = sys.__stderr__ = self._streams[1]  # type: ignore[misc]
        os._exit = self._exit_after_writing_out(os._exit)  # type: ignore[assignment]
        threading.Thread(target=self._reader, name="viceroy-output", daemon=True).start()

    # --- writers (any thread) ------------------------------------------------------------

    def write(self, stream: str, data: bytes, fd: int) -> None:
        if self._forked:  # a child forked by user code: its fds lead to our pipes
            write_all(fd, data)
            return
        if not data:
            return
        with self._queue_lock:
            while self._queued > MAX_QUEUED:
                self._due = 0.0  # all of it, unfinished line too
                self._wake()
                self._drained.wait(1.0)
            # What was written at the fd level before this goes first. Checked where lines
            # start: print() writes a line in pieces, and a line is not cut in two for it.
            if self._line_start:
                ready = self._ready_pipes()
                if ready:
                    self._take_pipes(ready)
            self._append(stream, data)
            if self._due is None and b"\n" in data:
                self._due = time.monotonic() + LINE_DELAY_S
                self._wake()

    def flush(self, durable: bool = False) -> None:
        """Send what is queued now, an unfinished line too. `durable` (an explicit flush): from
        this thread, so that it is in the link when flush returns and a kill right after cannot
        take it (the reader, had it sent it, could have been killed between taking the lines
        and sending them). Otherwise the reader sends it, right away."""
        if self._forked:
            return
        # Not on the reader (which sends anyway), nor in a signal handler run inside a send or
        # a write on this thread (waiting there for the reader, which may wait for what that
        # holds, would wait for itself), nor for longer than a second: then the reader sends
        # it, as soon as it can.
        if (durable and threading.get_ident() != self._reader_ident and not self._sending_here()
                and not owned(self._queue_lock)):
            with self._send_turn(1.0) as got:
                if got:
                    self._forward_queue(everything=True)
                    return
        with self._queue_lock:
            if self._queue:
                self._due = 0.0
                self._wake()

    def send_written(self) -> None:
        """Send what was written so far, an unfinished line too, before a message that must
        come after it (a display: as in IPython, a line printed before it shows above it).
        Called by the thread about to send that message. Bounded, as `flush`: a signal handler
        on a thread that holds `_sending` does not wait for itself."""
        if self._forked:
            return
        for stream in self._streams:  # the text layer's unfinished line, into the queue
            with contextlib.suppress(OSError, ValueError):
                io.TextIOWrapper.flush(stream)
        with self._send_turn(1.0) as got:
            if got:
                self._forward_queue(everything=True)

    @contextlib.contextmanager
    def _send_turn(self, timeout: float = -1) -> Iterator[bool]:
        """`_sending`, if it can be had within `timeout` s (-1: however long); yields whether it
        was. Not on the thread that holds it already (a signal handler run inside a send, which
        must not wait for itself): False at once. Released however the block ends, an
        interrupt landing right after the acquire too."""
        if owned(self._sending):
            yield False
            return
        got = False
        try:
            got = self._sending.acquire(timeout=timeout)
            yield got
        finally:
            if got:
                self._sending.release()

    def _take_queue(self) -> list[tuple[str, bytearray]]:
        """Empty the queue (holding the queue lock); what it held."""
        batch, self._queue = self._queue, []
        self._queued, self._due, self._line_start = 0, None, True
        self._drained.notify_all()
        return batch

    def _exit_after_writing_out(self, real_exit: Callable[[int], NoReturn]) -> Callable[[int], NoReturn]:
        """`os._exit` for the rank: what is queued (an unfinished line too) first goes into the
        pipes, which the agent reads out after the exit. Never blocks for long: a pipe that
        stays full (the agent gone, the reader stuck) gets what fits within a second. A child
        forked by user code exits as it would anywhere, writing out nothing (its copy of the
        queue is the parent's)."""

        def _exit(code: int) -> NoReturn:
            if not self._forked:
                try:
                    self._write_out_before_exit(time.monotonic() + 1.0)
                except BaseException:  # nothing may stop an exit
                    pass
            real_exit(code)

        _exit.__doc__ = real_exit.__doc__
        return _exit

    def _write_out_before_exit(self, deadline: float) -> None:
        for stream in self._streams:  # the text layer's unfinished line, into the queue
            with contextlib.suppress(OSError, ValueError):
                io.TextIOWrapper.flush(stream)
        # Kept till the exit: the reader, which would take lines out of the pipes, is done
        # sending what it took and takes nothing more. (Not had within the deadline, the reader
        # is stuck on a full link, or this thread interrupted its own send: on all the same.)
        if not owned(self._sending) and not self._sending_here():
            self._sending.acquire(timeout=max(0.0, deadline - time.monotonic() - 0.5))
        if not self._queue_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            return
        try:
            batch = self._take_queue()
        finally:
            self._queue_lock.release()
        for name, data in batch:
            if not write_before(_FD[name], bytes(data), deadline):
                return

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:
            pass  # the reader has wake-ups waiting already

    def _after_fork(self) -> None:
        self._forked = True

    # --- calls (the rank's main thread, between user code) --------------------------------

    def begin_call(self, call_id: int) -> None:
        with self._send_turn():
            self._call, self._sent, self._dropped = call_id, 0, 0

    def end_call(self) -> None:
        """Forward everything written so far (before the call's reply goes out)."""
        for stream in self._streams:  # an unfinished line, bytes written to .buffer
            try:
                io.TextIOWrapper.flush(stream)  # into the queue; sent just below
            except (OSError, ValueError):
                pass
        with self._send_turn():
            self._forward_queue(everything=True)
            if self._dropped:
                self._notice(f"{self._dropped} more bytes of output dropped")
            self._call = None

    # --- the reader thread ---------------------------------------------------------------

    def _reader(self) -> None:
        self._reader_ident = threading.get_ident()
        poller = select.poll()
        for fd in (*self._fds, self._wake_r):
            poller.register(fd, select.POLLIN)
        while True:
            due = self._due
            timeout = None if due is None else max(0, int((due - time.monotonic()) * 1000) + 1)
            try:
                poller.poll(timeout)
            except InterruptedError:
                continue
            try:
                while os.read(self._wake_r, 4096):
                    pass
            except BlockingIOError:
                pass
            with self._send_turn():
                self._forward_queue(everything=False)

    def _forward_queue(self, everything: bool) -> None:
        """Take the queue and what the pipes hold, and send it (holding `_sending`). Unless
        `everything` (or a flush was asked, or fd-level output arrived, which must not pass
        them), the queue goes only once its lines are due, and a last unfinished line stays."""
        with self._queue_lock:
            ready = self._ready_pipes()
            asked = self._due == 0.0  # a flush
            if not (everything or ready or (self._due is not None and time.monotonic() >= self._due)):
                return
            keep = None if everything or ready or asked else self._split_unfinished_line()
            if ready:
                self._take_pipes(ready)
            batch, self._queue = self._queue, [keep] if keep else []
            self._queued = len(keep[1]) if keep else 0
            self._due = None
            self._line_start = not self._queue
            if batch:  # writers wait only while much is queued (not at a call's end with none)
                self._drained.notify_all()
        for stream, data in batch:
            self._forward(stream, bytes(data))

    def _split_unfinished_line(self) -> tuple[str, bytearray] | None:
        """Take a last line not finished yet off the queue (it goes with its newline)."""
        if not self._queue:
            return None
        stream, data = self._queue[-1]
        cut = data.rfind(b"\n") + 1
        if cut == len(data):
            return None
        rest = data[cut:]
        if cut:
            del data[cut:]
        else:
            self._queue.pop()
        return stream, rest

    def _ready_pipes(self) -> list[tuple[int, int]]:
        """The fd-level pipes that hold output (holding the queue lock). A signal handler that
        prints, run inside this very check (the poll syscall was interrupted, and Python runs
        handlers before retrying it), checks with a poll object of its own: select.poll refuses
        a second poll of one object while the first is not over."""
        try:
            return self._pipes.poll(0)
        except RuntimeError:  # "concurrent poll() invocation": this thread, further out
            nested = select.poll()
            for fd in self._fds:
                nested.register(fd, select.POLLIN)
            return nested.poll(0)

    def _take_pipes(self, ready: list[tuple[int, int]]) -> None:
        """Move what the `ready` fd-level pipes hold into the queue (holding the queue lock)."""
        for fd, _ in sorted(ready):  # stdout's pipe first, as it was created first
            stream = self._fds[fd]
            while True:
                try:
                    data = os.read(fd, 1 << 16)
                except BlockingIOError:
                    break
                except InterruptedError:
                    continue
                if not data:
                    break
                self._append(stream, data)

    def _append(self, stream: str, data: bytes) -> None:
        queue = self._queue
        if queue and queue[-1][0] == stream:
            queue[-1][1].extend(data)
        else:
            queue.append((stream, bytearray(data)))
        self._queued += len(data)
        self._line_start = data.endswith(b"\n")

    def _forward(self, stream: str, data: bytes) -> None:
        call = self._call if self._call is not None else self._current_call()
        room = self._limit - self._sent
        if len(data) <= room:
            self._sent += len(data)
            self._sent_on(stream, data, call)
            return
        cut = cut_at(data, room, first=self._sent == 0)
        if cut:
            self._sent_on(stream, data[:cut], call)
        self._sent = self._limit  # nothing more goes, not even a line short enough to fit
        first_dropped = not self._dropped
        self._dropped += len(data) - cut
        if first_dropped:  # once, also when what came before filled the limit to the byte
            self._notice(
                f"output of this call passed the limit of {self._limit} bytes; the rest is "
                "dropped (raise it with Mesh.local(..., output_limit=BYTES) or %mesh up ... --output-limit BYTES, "
                "or write to a file)"
            )

    def _sent_on(self, stream: str, data: bytes, call: int | None) -> None:
        self._send(stream, data, call)
        self._unfinished = None if data.endswith(b"\n") else stream

    def _notice(self, text: str) -> None:
        # On a line of its own: after a line the rank left unfinished on stderr, not after an
        # empty one.
        start = "\n" if self._unfinished == "stderr" else ""
        self._unfinished = None
        self._send("stderr", f"{start}[viceroy] rank {self._rank}: {text}\n".encode(), self._call)


def cut_at(data: bytes, room: int, first: bool) -> int:
    """How much of `data` to forward when only `room` bytes are left: up to the last whole line
    that fits, so the output ends on a line the rank wrote, not on a piece of one. Only a call
    whose very first line is longer than the whole limit gets that line's first `room` bytes
    (`first`: nothing was forwarded yet), so that it shows something."""
    cut = data.rfind(b"\n", 0, room) + 1
    return cut if cut or not first else room


def owned(lock: threading.RLock) -> bool:
    """Whether the calling thread holds `lock` (as threading.Condition asks an RLock)."""
    return bool(lock._is_owned())  # type: ignore[attr-defined]
