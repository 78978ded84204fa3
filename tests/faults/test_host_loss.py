"""Host loss on one machine (no root needed): agents and the controller beat to each other, so a
frozen or killed agent is given up within 5 s, naming its host, and a frozen controller's agents
take their ranks down by themselves. (Cut links between namespaces: tests/launchers.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import viceroy as vr
from tests.conftest import live_pids, remove_files, wait_running, wait_until
from viceroy.runtime.procs import socket_dir


@pytest.mark.parametrize("sig", [signal.SIGSTOP, signal.SIGKILL], ids=["SIGSTOP", "SIGKILL"])
def test_a_frozen_or_killed_agent_loses_its_host_within_5s(start_mesh, sig):
    mesh = start_mesh(hosts=2, gpus=2)
    mesh.run("x = rank")
    agent = mesh._controller.agent_processes()[1]
    rundir = socket_dir(mesh._controller.agent_info[1]["endpoints"][0])
    fut = mesh.run("import time\ntime.sleep(60)", block=False)
    wait_running(mesh, "time.sleep")
    t0 = time.monotonic()
    os.kill(agent.proc.pid, sig)  # type: ignore[attr-defined]
    with pytest.raises(vr.MeshError) as err:
        fut.get(timeout=10)
    assert time.monotonic() - t0 < 5.0
    expected = "no heartbeat from its agent" if sig == signal.SIGSTOP else "its agent on host 1 exited (SIGKILL)"
    assert f"ranks 2-3: died (host 1 (local, pid {agent.proc.pid}) lost: {expected}" in str(err.value)  # type: ignore[attr-defined]
    assert mesh._controller.lost_hosts().keys() == {1}
    # Its socket directory goes too (the agent that would have removed it was killed).
    wait_until(lambda: not os.path.exists(rundir), 5, f"the lost agent's {rundir} to be removed")
    mesh.restart(failed_only=True)
    assert mesh.run("globals().get('x')").values() == [0, 1, None, None]
    assert mesh._controller.lost_hosts() == {}


CONTROLLER = textwrap.dedent("""
    import json, time, viceroy as vr
    mesh = vr.Mesh.local(hosts=2, gpus=1, preload=[], echo=False)
    agents = [a.proc.pid for a in mesh._controller.agent_processes()]
    left = [mesh._controller._sockets._rundir] + [a._log_path for a in mesh._controller.agent_processes()]
    print(json.dumps({"ranks": list(mesh.pids().values()), "agents": agents, "files": left}), flush=True)
    time.sleep(120)
""")


@pytest.mark.slow  # waits out an agent's 10 s of silence
def test_agents_of_a_frozen_controller_take_their_ranks_down():
    """The stdin lifeline only sees a controller that died; heartbeats also see one that hangs
    (or a link that never comes back)."""
    proc = subprocess.Popen([sys.executable, "-c", CONTROLLER], stdout=subprocess.PIPE, text=True)
    pids = {}
    try:
        assert proc.stdout is not None
        pids = json.loads(proc.stdout.readline())
        everything = pids["ranks"] + pids["agents"]
        os.kill(proc.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        wait_until(lambda: not live_pids(everything), 15, f"the agents and ranks to exit: {live_pids(everything)}")
        assert time.monotonic() - t0 > 3.0  # not before the controller could have decided
    finally:
        proc.kill()
        proc.wait()
        if pids:  # what the frozen, then killed, controller could not remove
            remove_files(pids["files"])
