"""Process plumbing: lifelines, subreaping, exit descriptions, the host's GPUs. Linux first; degrade elsewhere."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable

_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Orphaned descendants are re-parented to this process, so it can waitpid() them."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def orphaned(parent: int, wait: float = 1.0) -> bool:
    """Whether this process has lost `parent` (it was re-parented), waiting up to `wait` s: a
    lifeline's EOF may come a moment before the orphan is re-parented."""
    deadline = time.monotonic() + wait
    while os.getppid() == parent:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def remove_run_dir(path: str) -> None:
    """Remove a socket directory of ours (``/tmp/viceroy-*``); any other path is left alone."""
    if os.path.basename(path.rstrip("/")).startswith("viceroy-"):
        shutil.rmtree(path, ignore_errors=True)


def socket_dir(address: str) -> str | None:
    """The directory of an ``ipc://DIR/NAME`` socket; None for other addresses (TCP)."""
    return os.path.dirname(address[len("ipc://"):]) if address.startswith("ipc://") else None


def remove_socket_dir(address: str) -> None:
    """Remove the directory of an ``ipc://DIR/NAME`` socket of ours; other addresses have none."""
    path = socket_dir(address)
    if path is not None:
        remove_run_dir(path)


def clean_after_dead_parent(parent: int, controller_in: str, wait: float = 1.0) -> bool:
    """An agent whose parent, the controller, died (any signal: it cleaned up nothing) removes
    what that controller left on this host: its socket directory (``ipc://`` addresses only)
    and the agent's own log file (the stdout the launcher gave it). Nothing is touched while
    `parent` is still our parent: a live controller may only have closed our lifeline."""
    if not orphaned(parent, wait):
        return False
    remove_socket_dir(controller_in)
    with contextlib.suppress(OSError):
        log = os.readlink("/proc/self/fd/1")
        if os.path.basename(log).startswith("viceroy-agent") and log.endswith(".log"):
            os.unlink(log)
    return True


def hold_lifeline(fd: int, on_cut: Callable[[], None]) -> threading.Thread:
    """Watch the read end of a pipe whose write end only the parent holds: EOF means the parent
    is gone (any signal, SIGKILL included), and `on_cut` runs. Returns the watcher thread."""

    def watch() -> None:
        while True:
            try:
                if os.read(fd, 4096) == b"":
                    break
            except InterruptedError:
                continue
            except OSError:
                break
        on_cut()

    t = threading.Thread(target=watch, name="viceroy-lifeline", daemon=True)
    t.start()
    return t


def describe_exit(status: int) -> str:
    """A waitpid status as a user reads it: ``SIGKILL`` or ``exit code 1``."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            return signal.Signals(sig).name
        except ValueError:
            return f"signal {sig}"
    if os.WIFEXITED(status):
        return f"exit code {os.WEXITSTATUS(status)}"
    return f"status {status}"


def die_now(code: int = 1) -> None:
    os._exit(code)


# --- heartbeats: the lifeline across hosts -------------------------------------------------------
# Agents and the controller send each other a signed heartbeat every HEARTBEAT_S. The
# controller declares a host lost after host_timeout() of silence from its agent (a SIGKILLed
# agent, a cut link, a frozen machine); an agent that hears nothing from its controller for
# agent_timeout() kills its ranks and exits, so a controller that vanished (or a link that never
# came back) leaves no process behind on any host, whatever started the agent.

HEARTBEAT_S = 0.5


def host_timeout() -> float:
    """Seconds of silence after which the controller gives a host up ($VICEROY_HOST_TIMEOUT)."""
    return float(os.environ.get("VICEROY_HOST_TIMEOUT", "3.0"))


def agent_timeout(host_timeout_s: float) -> float:
    """An agent waits longer than the controller does: the controller decides first, and a
    controller busy for a few seconds (a long call holding the GIL) does not cost the ranks."""
    return host_timeout_s + 7.0
