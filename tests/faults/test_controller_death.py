"""The controller dies by SIGKILL: nothing it started may survive, nor be left behind."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import live_pids, wait_until

SCRIPT = textwrap.dedent("""
    import json, os, sys, time, viceroy as vr
    mesh = vr.Mesh.local(hosts=2, gpus=2, preload=[], echo=False)
    agents = [a.proc.pid for a in mesh._controller.agent_processes()]
    zygotes = [info["zygote"] for info in mesh._controller.agent_info.values()]
    mesh.run("import time\\ntime.sleep(60)", block=False)  # busy ranks die too
    left = [mesh._controller._sockets._rundir] + [a._log_path for a in mesh._controller.agent_processes()]
    print(json.dumps({"ranks": list(mesh.pids().values()), "agents": agents, "zygotes": zygotes, "files": left}), flush=True)
    time.sleep(120)
""")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killing_the_controller_takes_every_agent_and_rank_down_within_5s(sig):
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        pids = json.loads(line)
        everything = pids["ranks"] + pids["agents"] + pids["zygotes"]
        assert len(pids["ranks"]) == 4 and len(pids["agents"]) == 2
        assert len(live_pids(everything)) == len(everything)
        os.kill(proc.pid, sig)
        proc.wait(timeout=5)
        wait_until(lambda: not live_pids(everything), 5, f"all mesh processes to exit: {live_pids(everything)}")
        # ...nor what the controller would have removed: its socket directory, the agents' logs
        # (before: left in /tmp by every kernel that crashed)
        assert len(pids["files"]) == 3 and all(pids["files"])
        wait_until(lambda: not any(map(os.path.exists, pids["files"])), 5, f"{pids['files']} to be removed")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
