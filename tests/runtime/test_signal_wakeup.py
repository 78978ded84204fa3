"""A signal that comes between calls runs its handler on the rank at once, whichever of the
rank's threads the system gave it to. Real ranks; the signal goes to one thread with tgkill,
as the system may pick any thread that does not block it for a signal sent to the process."""

from __future__ import annotations

import ctypes
import os
import signal
from pathlib import Path

import pytest

import viceroy as vr
from tests.conftest import wait_until

_libc = ctypes.CDLL(None, use_errno=True)


@pytest.fixture(params=[{"gpus": 1}, {"hosts": 2, "gpus": 1}], ids=["direct", "relayed"])
def mesh(start_mesh, request) -> vr.Mesh:
    return start_mesh(**request.param)


def _threads_taking(pid: int, signum: int) -> list[int]:
    """The rank's threads other than its main one that do not block `signum`."""
    taking = []
    for tid in map(int, os.listdir(f"/proc/{pid}/task")):
        status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        blocked = int(next(line for line in status.splitlines() if line.startswith("SigBlk:")).split()[1], 16)
        if tid != pid and not blocked & (1 << (signum - 1)):
            taking.append(tid)
    return taking


def _tgkill(pid: int, tid: int, signum: int) -> None:
    if _libc.tgkill(pid, tid, signum) != 0:
        raise OSError(ctypes.get_errno(), f"tgkill({pid}, {tid}, {signum})")


def test_a_signal_given_to_another_thread_of_a_waiting_rank_runs_its_handler(mesh, tmp_path):
    # The rank's main thread waited for the next call in a blocking read: a signal the system
    # gave to another thread (its IO or output thread) left it asleep, and the handler ran only
    # when the next call came.
    ran = tmp_path / "ran"
    mesh.run(f"import signal\nsignal.signal(signal.SIGUSR1, lambda signum, frame: open({str(ran)!r}, 'a').write('ran\\n'))")
    pid = mesh.pids()[0]
    others = _threads_taking(pid, signal.SIGUSR1)
    assert others, "the rank has no thread but its main one that takes SIGUSR1"
    for n, tid in enumerate(others, 1):
        _tgkill(pid, tid, signal.SIGUSR1)
        wait_until(lambda: ran.exists() and ran.read_text().count("ran") == n, 10,  # noqa: B023
                   f"the handler to run for the signal given to thread {tid}")
    assert mesh.run("rank").values()[0] == 0  # and it goes on


def test_a_wakeup_fd_the_user_set_still_gets_the_signals_that_came_between_calls(mesh):
    # asyncio's add_signal_handler sets one: the loop learns of the signal from it.
    mesh.run("import signal, socket\nr, w = socket.socketpair()\nr.setblocking(False)\nw.setblocking(False)\n"
             "signal.signal(signal.SIGUSR2, lambda signum, frame: None)\nsignal.set_wakeup_fd(w.fileno())")
    mesh.run("got = b''\ndef take():\n    global got\n    try:\n        got += r.recv(64)\n"
             "    except BlockingIOError:\n        pass\n    return got")
    pid = mesh.pids()[0]
    _tgkill(pid, _threads_taking(pid, signal.SIGUSR2)[0], signal.SIGUSR2)
    os.kill(pid, signal.SIGUSR2)
    wait_until(lambda: mesh.run("take()").values()[0] == bytes([signal.SIGUSR2]) * 2, 10,
               "both signals' bytes on the user's wakeup fd")
    assert mesh.run("signal.set_wakeup_fd(w.fileno()) == w.fileno()").values()[0] is True  # theirs again


def test_a_wakeup_fd_the_user_closed_leaves_the_rank_waking_for_signals(mesh, tmp_path):
    ran = tmp_path / "ran"
    mesh.run("import signal, socket\nr, w = socket.socketpair()\nw.setblocking(False)\nsignal.set_wakeup_fd(w.fileno())\n"
             f"signal.signal(signal.SIGUSR1, lambda signum, frame: open({str(ran)!r}, 'a').write('ran\\n'))")
    mesh.run("w.close()\nr.close()")  # still set: the wait between calls cannot put it back
    assert mesh.run("rank").values()[0] == 0
    pid = mesh.pids()[0]
    _tgkill(pid, _threads_taking(pid, signal.SIGUSR1)[0], signal.SIGUSR1)
    wait_until(ran.exists, 10, "the handler to run for the signal given to another thread")
    assert mesh.run("rank").values()[0] == 0
