"""Processes that user code on a rank starts (a subprocess, a data-loader worker, a server, a
daemon that double-forked into a session of its own) belong to the mesh: none outlives it, nor
the kernel; a rank that dies or is restarted takes them with it (those in its process group,
and daemons, by the tag in their environment), and leaves its siblings' alone.

They are re-parented away from this test process once their rank is gone, so the autouse
leak check cannot see them: each test looks for its own pids, and kills whichever of them (and
only those: their command line bears the test's mark) are still there at its end."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import psutil
import pytest

from tests.conftest import live_pids, remove_files, wait_until

MARK = f"{600 + os.getpid() % 1000}"  # `sleep MARK`, `python -c DAEMON MARK`: ours to find and kill

# Double-forks into a session of its own (a classic daemon), prints its pid and lets go of the
# pipe it printed it on.
DAEMON = textwrap.dedent("""
    import os, sys, time
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            print(os.getpid(), flush=True)
            os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
            time.sleep(int(sys.argv[1]))
        os._exit(0)
    os.wait()
""")

# On each rank: a plain child (same process group) and a daemon; their pids.
START_CHILDREN = textwrap.dedent("""
    import subprocess, sys
    _child = subprocess.Popen(["sleep", mark])
    _daemon = int(subprocess.run([sys.executable, "-c", daemon, mark], stdout=subprocess.PIPE,
                                 check=True, timeout=30).stdout)
    {"child": _child.pid, "daemon": _daemon}
""")


def start_children(mesh) -> dict[int, dict[str, int]]:
    """rank -> {"child": pid, "daemon": pid} of the processes each rank of `mesh` started."""
    found = mesh.run(START_CHILDREN, mark=MARK, daemon=DAEMON)
    return dict(zip(mesh.pids(), found.values(), strict=True))


def pids_of(children: dict[int, dict[str, int]], kind: str | None = None) -> list[int]:
    return [pid for c in children.values() for k, pid in c.items() if kind in (None, k)]


@pytest.fixture
def ours() -> Iterator[list[int]]:
    """Pids of processes the test's ranks started; those still alive at the end are killed."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(pid)
            if MARK in p.cmdline():
                p.kill()


def test_processes_started_on_ranks_do_not_outlive_the_mesh(start_mesh, ours):
    mesh = start_mesh(gpus=2)
    children = start_children(mesh)
    ours += pids_of(children)
    assert len(live_pids(ours)) == 4
    mesh.shutdown()
    wait_until(lambda: not live_pids(ours), 5, f"the ranks' children and daemons to exit: {live_pids(ours)}")


def test_processes_started_on_ranks_do_not_outlive_a_simulated_multi_host_mesh(start_mesh, ours):
    mesh = start_mesh(hosts=2, gpus=1)  # agents that relay: the same cleanup on every host
    ours += pids_of(start_children(mesh))
    assert len(live_pids(ours)) == 4
    mesh.shutdown()
    wait_until(lambda: not live_pids(ours), 5, f"the ranks' children and daemons to exit: {live_pids(ours)}")


def test_shutting_a_mesh_down_leaves_other_processes_alone(start_mesh, ours):
    neighbour = start_mesh(gpus=1)  # another mesh of this controller, and a process of its own
    mine = subprocess.Popen(["sleep", MARK])
    try:
        theirs = pids_of(start_children(neighbour))
        mesh = start_mesh(gpus=2)
        ours += theirs + pids_of(start_children(mesh))
        mesh.shutdown()
        wait_until(lambda: live_pids(ours) == theirs, 5, "this mesh's children and daemons to exit")
        assert mine.poll() is None and neighbour.run("rank").values() == [0]
    finally:
        mine.kill()
        mine.wait()


def test_restarting_the_ranks_ends_their_children(start_mesh, ours):
    mesh = start_mesh(gpus=2)
    children = start_children(mesh)
    ours += pids_of(children)
    mesh.restart()
    # daemons that left their rank's process group too: they carry their rank's tag
    wait_until(lambda: not live_pids(ours), 5, f"the restarted ranks' children and daemons to exit: {live_pids(ours)}")
    assert mesh.run("rank").values() == [0, 1]


def test_a_rank_that_dies_takes_its_children_along_and_leaves_its_siblings_alone(start_mesh, ours):
    mesh = start_mesh(gpus=2)
    children = start_children(mesh)
    ours += pids_of(children)
    os.kill(mesh.pids()[1], signal.SIGKILL)
    wait_until(lambda: mesh.states()[1] == "dead", 5, "rank 1 to be dead")
    wait_until(lambda: not live_pids(list(children[1].values())), 5, "the dead rank's child and daemon to exit")
    assert len(live_pids(list(children[0].values()))) == 2
    mesh.restart(failed_only=True)
    assert len(live_pids(list(children[0].values()))) == 2 and mesh.run("rank").values() == [0, 1]
    mesh.shutdown()
    wait_until(lambda: not live_pids(ours), 5, f"the rest to exit with the mesh: {live_pids(ours)}")


def test_the_ranks_of_a_killed_agent_take_their_children_and_daemons_along(start_mesh, ours):
    mesh = start_mesh(hosts=2, gpus=1)
    children = start_children(mesh)
    ours += pids_of(children)
    os.kill(mesh._controller.agent_processes()[1].proc.pid, signal.SIGKILL)
    # The daemon left the agent's tree with it; the controller finds it by the launch's tag.
    wait_until(lambda: not live_pids(list(children[1].values())), 5, "the lost host's rank's child and daemon to exit")
    assert len(live_pids(list(children[0].values()))) == 2


def test_a_frozen_agent_given_up_takes_its_ranks_children_and_daemons_along(start_mesh, ours):
    mesh = start_mesh(hosts=2, gpus=1)
    children = start_children(mesh)
    ours += pids_of(children)
    os.kill(mesh._controller.agent_processes()[1].proc.pid, signal.SIGSTOP)
    wait_until(lambda: mesh._controller.lost_hosts(), 10, "host 1 to be given up")
    wait_until(lambda: not live_pids(list(children[1].values())), 5, "the lost host's rank's processes to exit")
    assert len(live_pids(list(children[0].values()))) == 2


CONTROLLER = textwrap.dedent("""
    import json, sys, time, viceroy as vr
    mesh = vr.Mesh.local(gpus=2, preload=[], echo=False)
    found = mesh.run(sys.argv[1], mark=sys.argv[2], daemon=sys.argv[3]).values()
    left = [mesh._controller._sockets._rundir] + [a._log_path for a in mesh._controller.agent_processes()]
    print(json.dumps({"pids": [p for c in found for p in c.values()], "files": left}), flush=True)
    time.sleep(120)
""")


def test_processes_started_on_ranks_do_not_outlive_a_killed_controller(ours):
    proc = subprocess.Popen([sys.executable, "-c", CONTROLLER, START_CHILDREN, MARK, DAEMON],
                            stdout=subprocess.PIPE, text=True)
    files: list[str] = []
    try:
        assert proc.stdout is not None
        info = json.loads(proc.stdout.readline())
        ours += info["pids"]
        files = info["files"]
        assert len(live_pids(ours)) == 4
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)
        wait_until(lambda: not live_pids(ours), 5, f"the ranks' children and daemons to exit: {live_pids(ours)}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        with contextlib.suppress(AssertionError):  # the agent removes them, given a moment
            wait_until(lambda: not any(map(os.path.exists, files)), 5, "the agent to clean up")
        remove_files(files)
