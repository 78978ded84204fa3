"""Ending one launch's processes by its tag (what the ssh launcher runs on a host whose agent it
could not reach): the script fed to a Python on stdin, as over ssh, with real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.conftest import live_pids, wait_until
from viceroy.runtime import remains

# A tagged "agent", a child subreaper as an agent is, holding a child and a daemon that
# double-forked into a session of its own without the tag in its environment; it prints their
# pids (its own first).
_TREE = r"""
import ctypes, os, subprocess, sys, time
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    pid = os.fork()
    if pid == 0:
        os.environ.pop("VICEROY_AGENT_ID", None)
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(600)"])
    os.write(w, str(pid).encode())
    os._exit(0)
os.wait()
print(os.getpid(), child.pid, int(os.read(r, 32)), flush=True)
time.sleep(600)
"""


def _tree(nonce: str) -> tuple[subprocess.Popen[str], list[int]]:
    env = {**os.environ, remains.TAG: nonce}
    proc = subprocess.Popen([sys.executable, "-c", _TREE], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, [int(p) for p in proc.stdout.readline().split()]


def test_a_launch_is_ended_by_its_tag_daemons_included_and_nothing_else():
    mine, other = remains.new_nonce(), remains.new_nonce()
    procs: list[subprocess.Popen[str]] = []
    pids: list[int] = []
    try:
        a, pids_a = _tree(mine)
        procs.append(a)
        pids += pids_a
        b, pids_b = _tree(other)  # another launch: left alone
        procs.append(b)
        pids += pids_b
        assert len(pids_a) == len(pids_b) == 3
        # as over ssh: `ssh HOST "exec PYTHON - NONCE"`, the script on stdin
        assert remains.end_over_ssh(["sh", "-c"], sys.executable, mine, "host 0 (test)", timeout=30) is None
        assert a.wait(timeout=10) == -signal.SIGKILL
        wait_until(lambda: not live_pids(pids_a), 10, f"the tagged launch to exit: {live_pids(pids_a)}")
        assert live_pids(pids_b) == pids_b
    finally:
        for pid in live_pids(pids):
            os.kill(pid, signal.SIGKILL)
        for p in procs:
            p.wait()


def test_a_bad_nonce_is_refused_and_a_host_out_of_reach_says_what_to_do():
    script = Path(remains.__file__).read_text()
    bad = subprocess.run([sys.executable, "-", "../x"], input=script, capture_output=True, text=True)
    assert bad.returncode == 2 and "usage" in bad.stderr
    nonce = remains.new_nonce()
    why = remains.end_over_ssh(["sh", "-c", "exit 255", "--"], sys.executable, nonce, "host 3 (node3, via ssh)", 10)
    assert why is not None and "host 3 (node3, via ssh)" in why and "exit code 255" in why, why
    assert f"grep -l {remains.TAG}={nonce} /proc/[0-9]*/environ" in why
