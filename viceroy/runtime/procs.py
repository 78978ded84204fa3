"""Process plumbing: lifelines, subreaping, ending a process's descendants, exit descriptions.
Linux first; degrade elsewhere."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import math
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable

from viceroy.runtime.remains import process_table

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


# --- descendants: what ranks start belongs to the mesh ------------------------------------------
# Each rank leads a process group of its own (the fork server makes it so), as torchrun's
# workers do: what it starts (subprocesses, data-loader workers) is in that group unless it
# moved out. The agent is a child subreaper, so whatever a rank leaves behind, a daemon in a
# session of its own included, stays below the agent, where `end_descendants` finds it.


def signal_group(leader: int, sig: int) -> None:
    """Send `sig` to the process group `leader` leads (a rank, with what it started), or to
    `leader` alone if it leads none."""
    try:
        os.killpg(leader, sig)
    except ProcessLookupError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(leader, sig)
    except PermissionError:
        pass


def die_with_group(code: int = 0) -> None:
    """Exit now, taking along the process group this process leads, if it leads one (a rank
    whose agent is gone ends what it started: nothing else will)."""
    if os.getpgid(0) == os.getpid():
        with contextlib.suppress(OSError):
            os.killpg(0, signal.SIGKILL)  # this process too
    die_now(code)


def descendants(roots: set[int] | None = None) -> dict[int, int] | None:
    """pid -> process group of each live process below `roots` (this process by default);
    None where there is no /proc to read it from."""
    table = process_table()
    if table is None:
        return None
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: dict[int, int] = {}
    todo = list(roots or {os.getpid()})
    while todo:
        for pid in children.get(todo.pop(), ()):
            if pid not in found:
                todo.append(pid)
                found[pid] = table[pid][1]
    return {pid: pgid for pid, pgid in found.items() if table[pid][2]}


def end_descendants(grace: float = 0.0, group: int | None = None, root: int | None = None) -> bool:
    """End every process below `root` (this process by default; in process group `group` only,
    if given): SIGTERM and up to `grace` s to exit when `grace` > 0, then SIGKILL, and SIGKILL
    again to any forked meanwhile, until each one left has been sent it. A process in a session
    of its own is found all the same: below a child subreaper, an orphan stays below. False
    where there is no /proc to find them in (nothing was done)."""
    if group is not None:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return True  # an empty group (the usual case: a rank that started nothing); no scan
        except PermissionError:
            pass
    seen: set[int] = set()  # ours for certain: their children, even re-parented meanwhile, are too

    def left() -> dict[int, int] | None:
        found = descendants({os.getpid() if root is None else root, *seen})
        if found is None:
            return None
        seen.update(found)
        return found if group is None else {p: g for p, g in found.items() if g == group}

    def send(pids: Iterable[int], sig: int) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    found = left()
    if found is None:
        return False
    if grace > 0 and found:
        send(found, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while found and time.monotonic() < deadline:
            time.sleep(0.01)
            found = left() or {}
    killed: set[int] = set()
    while new := found.keys() - killed:  # once each has it, none of them can fork again
        send(new, signal.SIGKILL)
        killed |= new
        found = left() or {}
    return True


# --- heartbeats: the lifeline across hosts -------------------------------------------------------
# Agents and the controller send each other a signed heartbeat every HEARTBEAT_S. The
# controller declares a host lost after host_timeout() of silence from its agent (a SIGKILLed
# agent, a cut link, a frozen machine); an agent that hears nothing from its controller for
# agent_timeout() kills its ranks and exits, so a controller that vanished (or a link that never
# came back) leaves no process behind on any host, whatever started the agent.

HEARTBEAT_S = 0.5


def host_timeout() -> float:
    """Seconds of silence after which the controller gives a host up ($VICEROY_HOST_TIMEOUT)."""
    text = os.environ.get("VICEROY_HOST_TIMEOUT", "").strip()
    if not text:
        return 3.0
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"VICEROY_HOST_TIMEOUT={text!r}: give a positive number of seconds (no unit), e.g. "
                         "VICEROY_HOST_TIMEOUT=10; it is how long a host may stay silent before it is given up")
    return value


def agent_timeout(host_timeout_s: float) -> float:
    """An agent waits longer than the controller does: the controller decides first, and a
    controller busy for a few seconds (a long call holding the GIL) does not cost the ranks."""
    return host_timeout_s + 7.0
