"""A guard for a child that cannot hold a lifeline itself: ``salloc``, waiting for an allocation,
reads nothing from us, so a SIGKILLed controller left it (and its pending job) in the queue.

    python -m viceroy.runtime.guard OWNER PID NAME    (stdin: a pipe only OWNER writes to)

The guard holds the pipe as its lifeline (`procs.hold_lifeline`). When it breaks because OWNER
died (by any signal: nothing else cleaned up), the guard ends PID if that is still a process
called NAME: by SIGTERM at once while it has no child (salloc waiting: it withdraws its pending
request), else after a grace period in which it may end by itself (salloc granted: its command
sees the same EOF), and by SIGKILL if SIGTERM did not do it. An owner that closes the pipe and
lives on has ended PID itself: the guard just exits.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from viceroy.runtime.launcher import agent_env
from viceroy.runtime.procs import descendants, hold_lifeline, orphaned

GRACE_S = 15.0


def _name(pid: int) -> str | None:
    """The command name of live process `pid`; None if it is gone (or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    name, rest = stat[stat.index(b"(") + 1:stat.rindex(b")")], stat[stat.rindex(b")") + 2:]
    return None if rest[:1] in (b"Z", b"X") else name.decode(errors="replace")


def _gone_within(pid: int, name: str, wait: float) -> bool:
    deadline = time.monotonic() + wait
    while _name(pid) == name:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def end(pid: int, name: str, grace: float = GRACE_S) -> None:
    """End `pid` while it is still `name` (not a pid reused since). One that has a child running
    (salloc granted: its command runs) is first given `grace` s to end by itself, as that command
    exits at the lifeline's EOF and salloc then gives the allocation back in order; one without
    (salloc still waiting) is sent SIGTERM at once. SIGKILL if SIGTERM did not end it in `grace` s."""
    if descendants({pid}) and _gone_within(pid, name, grace):
        return
    if _name(pid) != name:
        return
    os.kill(pid, signal.SIGTERM)
    if not _gone_within(pid, name, grace):
        os.kill(pid, signal.SIGKILL)


def start_guard(pid: int, name: str) -> subprocess.Popen[bytes]:
    """Guard our child `pid` (called `name`): it is ended if this process dies before `stop_guard`.
    In a session of its own, so that the kernel's SIGINT does not reach it."""
    return subprocess.Popen([sys.executable, "-m", "viceroy.runtime.guard", str(os.getpid()), str(pid), name],
                            stdin=subprocess.PIPE, start_new_session=True, env=agent_env())


def stop_guard(guard: subprocess.Popen[bytes]) -> None:
    """Dismiss the guard once its process has been ended: it has nothing left to do, and may
    still be starting (importing viceroy), so it is killed rather than waited on to see EOF."""
    assert guard.stdin is not None
    guard.stdin.close()
    guard.kill()
    guard.wait()


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m viceroy.runtime.guard OWNER_PID PID NAME  (stdin: the owner's lifeline)", file=sys.stderr)
        return 2
    owner, pid, name = int(argv[0]), int(argv[1]), argv[2]
    cut = threading.Event()
    hold_lifeline(sys.stdin.fileno(), cut.set)
    cut.wait()
    if _name(pid) == name and orphaned(owner):
        try:
            end(pid, name)
        except ProcessLookupError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
