"""An agent killed outright cleans up nothing; what it left on its host is removed for it."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import live_pids, wait_until

# An agent's fork server, started as an agent starts it, then the "agent" dies by `how`.
AGENT = textwrap.dedent("""
    import json, os, select, signal, sys, tempfile
    from viceroy.runtime.forkserver import ForkServer
    rundir = tempfile.mkdtemp(prefix="viceroy-agent-")
    lifeline_r, lifeline_w = os.pipe()
    zygote = ForkServer(None, [], [], lifeline_r, rundir)
    assert select.select([zygote.fileno()], [], [], 60)[0] and zygote.replies()[0]["ready"]
    print(json.dumps({"zygote": zygote.pid, "rundir": rundir}), flush=True)
    if sys.argv[1] == "SIGKILL":
        os.kill(os.getpid(), signal.SIGKILL)
    zygote.proc.stdin.close()  # alive, but done with its fork server
    zygote.proc.wait(timeout=10)
""")


@pytest.mark.parametrize("how", ["SIGKILL", "closes"])
def test_the_fork_server_of_a_killed_agent_removes_its_socket_directory(how):
    # Only where its agent died: a live agent's directory is its own to remove.
    proc = subprocess.Popen([sys.executable, "-c", AGENT, how], stdout=subprocess.PIPE, text=True)
    info = {"rundir": ""}
    try:
        assert proc.stdout is not None
        info = json.loads(proc.stdout.readline())
        proc.wait(timeout=15)
        wait_until(lambda: not live_pids([info["zygote"]]), 5, "the fork server to exit")
        assert os.path.exists(info["rundir"]) == (how == "closes")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if os.path.isdir(info["rundir"]):
            os.rmdir(info["rundir"])
