"""The agent's process plumbing: the fork server it asks for ranks, and the OS's word on every
child's exit. Both hand the agent's event loop a file descriptor to poll."""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
from typing import Any


class Lines:
    """Complete lines from a non-seekable fd, as they arrive."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buf = b""
        self.closed = False

    def read(self) -> list[bytes]:
        chunk = os.read(self.fd, 65536)
        if not chunk:
            self.closed = True
        *lines, self._buf = (self._buf + chunk).split(b"\n")
        return lines


class ForkServer:
    """`python -m viceroy.runtime.zygote`: imports the heavy modules once, then forks ranks."""

    def __init__(self, cwd: str | None, sys_path: list[str], preload: list[str], lifeline_fd: int, rundir: str) -> None:
        # The fork server hands over each rank's output pipes here (see `output_pipes`).
        self._fds, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # a message per rank
        their_fd = theirs.fileno()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "viceroy.runtime.zygote"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            pass_fds=(lifeline_fd, their_fd),
            # The controller's directory, where this host has it (a shared filesystem); else home.
            cwd=cwd if os.path.isdir(cwd or "") else os.path.expanduser("~"),
        )
        theirs.close()
        assert self.proc.stdout is not None
        self._out = Lines(self.proc.stdout.fileno())
        self._send({"config": {"sys_path": sys_path, "preload": preload, "lifeline_fd": lifeline_fd,
                               "fd_sock": their_fd, "rundir": rundir}})

    @property
    def pid(self) -> int:
        return self.proc.pid

    def fileno(self) -> int:
        return self._out.fd

    def spawn(self, rank_cfg: dict[str, Any]) -> None:
        """Ask for a rank; its pid comes back as a message from `replies`."""
        self._send({"spawn": rank_cfg})

    def replies(self) -> list[dict[str, Any]]:
        """``{"ready": ...}`` once, then ``{"rank": r, "pid": p}`` per spawn; [] when closed."""
        return [json.loads(line) for line in self._out.read()]

    def output_pipes(self, rank: int) -> OutputPipes:
        """The read ends of `rank`'s stdout and stderr pipes, sent just before its
        ``{"rank": r, "pid": p}`` reply (none if they did not come)."""
        try:
            self._fds.settimeout(1.0)
            data, fds, _, _ = socket.recv_fds(self._fds, 64, 2)
        except OSError:
            return OutputPipes([])
        if data != str(rank).encode() or len(fds) != 2:
            OutputPipes(fds).close()
            return OutputPipes([])
        for fd in fds:
            os.set_blocking(fd, False)
        return OutputPipes(fds)

    @property
    def closed(self) -> bool:
        return self._out.closed

    def kill(self) -> None:
        try:
            self.proc.kill()
        except OSError:
            pass

    def _send(self, msg: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(msg) + "\n").encode())
        self.proc.stdin.flush()


class OutputPipes:
    """The agent's copies of the read ends of a rank's stdout and stderr pipes: once the rank
    died (and its own reader with it), what they still hold is its last words."""

    STREAMS = ("stdout", "stderr")

    def __init__(self, fds: list[int]) -> None:
        self._fds = fds

    def left(self, limit: int) -> list[tuple[str, bytes]]:
        """(stream, bytes) of what each pipe holds now, up to `limit` bytes each, no waiting."""
        out = []
        for stream, fd in zip(self.STREAMS, self._fds, strict=False):
            data = bytearray()
            while len(data) < limit:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:  # BlockingIOError: nothing more for now
                    break
                if not chunk:
                    break
                data += chunk
            if data:
                out.append((stream, bytes(data)))
        return out

    def close(self) -> None:
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds = []


class ChildExits:
    """Every child's exit, from waitpid() on a thread, the moment it happens. The agent is a
    child subreaper, so its ranks (double-forked by the fork server) are its children."""

    def __init__(self) -> None:
        r, self._w = os.pipe()
        self._lines = Lines(r)
        threading.Thread(target=self._reap, name="viceroy-reaper", daemon=True).start()

    def fileno(self) -> int:
        return self._lines.fd

    def read(self) -> list[tuple[int, int]]:
        """(pid, waitpid status) of the exits reported since the last read (blocks if none)."""
        return [(int(p), int(s)) for p, s in (ln.split() for ln in self._lines.read())]

    def wait(self, timeout: float) -> list[tuple[int, int]]:
        ready, _, _ = select.select([self._lines.fd], [], [], max(0.0, timeout))
        return self.read() if ready else []

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:  # no child at all, for now
                time.sleep(0.05)
                continue
            except InterruptedError:
                continue
            os.write(self._w, f"{pid} {status}\n".encode())
