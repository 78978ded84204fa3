"""The Slurm launcher against a real one-node cluster (munged + slurmctld + slurmd, started by
the fixture): agents are job steps, inside an allocation or in one the launcher asks for."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

import viceroy as vr
from tests.conftest import live_pids, remove_files, wait_running, wait_until


def _remote(mesh):
    """Every agent and rank pid (they hang off slurmstepd, not off us)."""
    ranks = list(mesh.pids().values())
    return ranks + sorted({psutil.Process(p).parent().pid for p in ranks})


def test_a_mesh_in_an_allocation_it_asked_for(slurm):
    mesh = vr.Mesh.slurm(hosts=2, gpus=2, agents_per_node=2, preload=[], echo=False)
    try:
        job = mesh._controller.launcher.job_id
        assert job in slurm.jobs()
        assert mesh.dims == {"hosts": 2, "gpus": 2}
        seen = mesh.run("import os\n(os.environ['SLURM_JOB_ID'], os.environ['SLURM_STEP_ID'], rank)").values()
        assert [s[0] for s in seen] == [job] * 4
        assert seen[0][1] == seen[1][1] != seen[2][1] == seen[3][1]  # one step per agent
        assert mesh.run("import os\nos.environ['MASTER_ADDR']").values() == [slurm.node] * 4  # the first node
        assert all(psutil.Process(p).parent().parent().name() == "slurmstepd" for p in mesh.pids().values())
        key = mesh._controller.signer.key.hex()
        for p in psutil.process_iter(["cmdline"]):
            assert key not in " ".join(p.info["cmdline"] or [])
        remote = _remote(mesh)
    finally:
        mesh.shutdown()
    wait_until(lambda: not live_pids(remote), 10, "the agents and ranks to exit")
    wait_until(lambda: job not in slurm.jobs(), 10, f"job {job} to be cancelled")


def test_a_mesh_inside_the_users_allocation(slurm, monkeypatch):
    slurm.run("salloc", "--no-shell", "--nodes=1", "--job-name=users-job")
    job = slurm.run("squeue", "-h", "-n", "users-job", "-o", "%i").strip()
    try:
        monkeypatch.setenv("SLURM_JOB_ID", job)
        monkeypatch.setenv("SLURM_JOB_NODELIST", slurm.node)
        monkeypatch.setenv("SLURM_JOB_NUM_NODES", "1")
        with vr.Mesh.slurm(gpus=1, agents_per_node=2, preload=[], echo=False) as mesh:  # hosts from the allocation
            assert mesh.dims == {"hosts": 2, "gpus": 1}
            assert mesh.run("import os\nos.environ['SLURM_JOB_ID']").values() == [job, job]
        assert job in slurm.jobs()  # the user's allocation is theirs to end
    finally:
        slurm.run("scancel", job)


def test_a_killed_agent_step_loses_its_host_and_comes_back(slurm):
    mesh = vr.Mesh.slurm(hosts=2, gpus=1, agents_per_node=2, preload=[], echo=False)
    try:
        agent = psutil.Process(mesh.pids()[1]).parent().pid
        fut = mesh.run("import time\ntime.sleep(60)", block=False)
        wait_running(mesh, "time.sleep")
        t0 = time.monotonic()
        os.kill(agent, signal.SIGKILL)
        with pytest.raises(vr.MeshError, match=rf"rank 1: died \(host 1 \({slurm.node}, Slurm job \d+\) lost"):
            fut.get(timeout=10)
        assert time.monotonic() - t0 < 5.0
        mesh.restart(failed_only=True)
        assert mesh.run("rank").values() == [0, 1]
    finally:
        mesh.shutdown()


CONTROLLER = textwrap.dedent("""
    import json, time, viceroy as vr
    mesh = vr.Mesh.slurm(hosts=2, gpus=1, agents_per_node=2, preload=[], echo=False)
    mesh.run("import time\\ntime.sleep(60)", block=False)
    logs = [a._log_path for a in mesh._controller.agent_processes()]  # srun's output, here
    print(json.dumps({"ranks": list(mesh.pids().values()), "files": logs}), flush=True)
    time.sleep(120)
""")


def test_controller_death_leaves_nothing_on_the_nodes(slurm):
    proc = subprocess.Popen([sys.executable, "-c", CONTROLLER], stdout=subprocess.PIPE, text=True)
    started = {"files": []}
    try:
        assert proc.stdout is not None
        started = json.loads(proc.stdout.readline())
        ranks = started["ranks"]
        everything = ranks + [psutil.Process(p).parent().pid for p in ranks]
        jobs = slurm.jobs()
        assert len(jobs) == 1  # the allocation the controller asked for
        here = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]  # salloc, its guard, sruns
        assert any(psutil.Process(p).name() == "salloc" for p in here)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        wait_until(lambda: not live_pids(everything), 10, f"the agents and ranks to exit: {live_pids(everything)}")
        wait_until(lambda: jobs[0] not in slurm.jobs(), 10, f"the dead controller's allocation {jobs[0]} to end")
        wait_until(lambda: not live_pids(here), 10, f"salloc, its guard and the sruns (pids {here}) to exit")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        subprocess.run(["scancel", "--name=viceroy"], capture_output=True)  # only if the test failed
        remove_files(started["files"])  # what the killed controller could not remove


def test_the_magic_starts_a_slurm_mesh(slurm):
    from viceroy.extension.args import parse_command
    from viceroy.extension.session import MeshSession

    cmd = parse_command("up hosts=1 gpus=2 --launcher slurm --preload none")
    session = MeshSession(None)
    try:
        mesh = session.up(cmd.dims, launcher=cmd.launcher, preload=cmd.preload)
        assert mesh.run("import os\n'SLURM_JOB_ID' in os.environ").values() == [True, True]
    finally:
        session.close()


def test_an_allocation_not_granted_in_time_is_explained(slurm):
    # (more nodes than the cluster has is refused at once: test_slurm_failures.py)
    from viceroy.runtime.slurm import SlurmError

    t0 = time.monotonic()
    with pytest.raises(SlurmError, match=r"^no allocation of 1 node\(s\) within 2 s \(.*salloc.*; Slurm's last pending "
                                         r"reason: BeginTime\); check salloc_options=\['--begin=now\+1hour'\]"):
        vr.Mesh.slurm(hosts=1, gpus=1, allocation_timeout=2, salloc_options=["--begin=now+1hour"], preload=[],
                      echo=False)
    assert time.monotonic() - t0 < 30
    assert slurm.jobs() == []


def test_the_users_master_addr_wins_over_the_first_node(slurm):
    with vr.Mesh.slurm(hosts=2, gpus=1, agents_per_node=2, preload=[], echo=False,
                       env={"MASTER_ADDR": "10.9.8.7"}) as mesh:
        assert mesh.run("import os\nos.environ['MASTER_ADDR']").values() == ["10.9.8.7"] * 2
