"""The ssh launcher against a real sshd: agents over ssh, the key never on a command line,
and nothing left behind when the controller goes."""

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap

import psutil
import pytest

import viceroy as vr
from tests.conftest import live_pids, remove_files, viceroy_temp_files, wait_until
from tests.launchers.conftest import SSH_OPTS


def _ssh_mesh(sshd, **dims):
    return vr.Mesh.ssh(
        ["127.0.0.1", "127.0.0.1"], port=sshd.port, identity=sshd.identity, ssh_options=SSH_OPTS,
        preload=[], echo=False, **dims,
    )


def test_a_mesh_over_ssh_runs_like_a_local_one(sshd):
    mesh = _ssh_mesh(sshd, gpus=2)
    try:
        assert mesh.dims == {"hosts": 2, "gpus": 2}
        assert mesh.run("rank * 10").values() == [0, 10, 20, 30]
        assert mesh.run("import os\nint(os.environ['LOCAL_RANK'])").values() == [0, 1, 0, 1]
        # each host's ranks hang off an agent started by sshd, not by us
        agents = {psutil.Process(p).parent() for p in mesh.pids().values()}
        assert len(agents) == 2
        assert {a.parent().name() for a in agents} <= {"sshd", "sshd-session"}
        # their hellos reached the ssh sessions: a session cut from now on is a lost host, not
        # a refused login to try again (test_ssh_failures)
        assert all(a._hello for a in mesh._controller._agents.values())
        remote = [a.pid for a in agents] + list(mesh.pids().values())
        with pytest.raises(vr.MeshError, match="rank 3: ZeroDivisionError"):
            mesh.run("1 / (rank - 3)", fail_fast=False)
    finally:
        mesh.shutdown()
    wait_until(lambda: not live_pids(remote), 5, "the remote agents and ranks to exit")


def test_agents_over_ssh_keep_their_files_in_the_runs_temp_directory(sshd):
    """The test sshd gives its logins this run's TMPDIR, as local agents inherit it: the leak
    checks see what an agent over ssh leaves, and no other run on the machine does."""
    mesh = _ssh_mesh(sshd, gpus=1)
    try:
        rundirs = {os.path.dirname(info["endpoints"][0].removeprefix("ipc://"))
                   for info in mesh._controller.agent_info.values()}
        assert len(rundirs) == 2 and {os.path.dirname(d) for d in rundirs} == {tempfile.gettempdir()}
        assert rundirs <= viceroy_temp_files()
    finally:
        mesh.shutdown()


def test_the_key_never_appears_on_a_command_line(sshd):
    mesh = _ssh_mesh(sshd, gpus=1)
    try:
        key = mesh._controller.signer.key.hex()
        for p in psutil.process_iter(["cmdline"]):
            assert key not in " ".join(p.info["cmdline"] or [])
    finally:
        mesh.shutdown()


def test_wrong_host_count_is_explained():
    from viceroy.runtime.ssh import SshLauncher

    with pytest.raises(ValueError, match=r"hosts=3 but 2 host\(s\) were given"):
        SshLauncher(["a", "b"]).plan({"hosts": 3, "gpus": 1})
    with pytest.raises(ValueError, match="first dim is 'hosts'"):
        SshLauncher(["a"]).plan({"gpus": 1})


def test_hostfile_parsing(tmp_path):
    from viceroy.runtime.ssh import SshHost, read_hostfile

    f = tmp_path / "hosts.txt"
    f.write_text("# cluster\nnode1\nnode2 python=/opt/venv/bin/python  # gpu box\n\n")
    assert read_hostfile(str(f)) == [SshHost("node1"), SshHost("node2", "/opt/venv/bin/python")]
    f.write_text("node1 gpus=8\n")
    with pytest.raises(ValueError, match=r"hosts.txt:1: unknown host option 'gpus=8'"):
        read_hostfile(str(f))


def test_controller_death_leaves_nothing_on_the_hosts(sshd):
    script = textwrap.dedent(f"""
        import json, time, viceroy as vr
        mesh = vr.Mesh.ssh(["127.0.0.1"], port={sshd.port}, identity={sshd.identity!r},
                           ssh_options={SSH_OPTS!r}, preload=[], echo=False, gpus=2)
        mesh.run("import time\\ntime.sleep(60)", block=False)
        logs = [a.current._log_path for a in mesh._controller.agent_processes()]  # the ssh client's output
        print(json.dumps({{"ranks": list(mesh.pids().values()), "files": logs}}), flush=True)
        time.sleep(120)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    started = {"files": []}
    try:
        started = json.loads(proc.stdout.readline())
        ranks = started["ranks"]
        assert len(live_pids(ranks)) == 2
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)
        wait_until(lambda: not live_pids(ranks), 10, "the remote ranks to exit")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        remove_files(started["files"])  # what the killed controller could not remove


def test_the_magic_starts_an_ssh_mesh_from_a_hostfile(sshd, tmp_path, monkeypatch):
    from IPython.core.error import UsageError

    from viceroy.extension.args import parse_command
    from viceroy.extension.session import MeshSession

    hosts = tmp_path / "hosts.txt"
    hosts.write_text("127.0.0.1\n127.0.0.1\n")
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host 127.0.0.1\n  Port {sshd.port}\n  IdentityFile {sshd.identity}\n"
        "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n"
    )
    monkeypatch.setenv("VICEROY_SSH_OPTIONS", f"-F {config}")
    cmd = parse_command(f"up hosts=2 gpus=1 --launcher ssh --hostfile {hosts} --preload none")
    assert (cmd.launcher, cmd.hostfile, cmd.dims) == ("ssh", str(hosts), {"hosts": 2, "gpus": 1})
    session = MeshSession(None)
    with pytest.raises(UsageError, match=r"hosts=3 but .* lists 2 host"):
        session.up({"hosts": 3, "gpus": 1}, launcher="ssh", hostfile=str(hosts), preload=[])
    with pytest.raises(UsageError, match="needs --hostfile"):
        session.up({"gpus": 1}, launcher="ssh")
    mesh = session.up(cmd.dims, launcher="ssh", hostfile=str(hosts), preload=[])
    try:
        assert mesh.dims == {"hosts": 2, "gpus": 1}
        assert mesh.run("coords").values() == [{"hosts": 0, "gpus": 0}, {"hosts": 1, "gpus": 0}]
    finally:
        session.close()


def test_a_controller_on_every_interface_is_reached_where_the_launcher_came_from():
    from viceroy.runtime.attach_agent import reach_controller

    cfg = {"host": 1, "controller_in": "tcp://0.0.0.0:5001", "controller_out": "tcp://0.0.0.0:5002"}
    via_ssh = reach_controller(cfg, {"SSH_CONNECTION": "10.1.2.3 52000 10.1.2.9 22"})
    assert (via_ssh["controller_in"], via_ssh["controller_out"]) == ("tcp://10.1.2.3:5001", "tcp://10.1.2.3:5002")
    assert reach_controller(cfg, {"SLURM_SRUN_COMM_HOST": "10.9.9.9"})["controller_in"] == "tcp://10.9.9.9:5001"
    named = {**cfg, "controller_in": "tcp://10.0.0.1:5001", "controller_out": "tcp://10.0.0.1:5002"}
    assert reach_controller(named, {"SSH_CONNECTION": "10.1.2.3 52000 10.1.2.9 22"}) == named
    with pytest.raises(SystemExit, match=r"listens on 0\.0\.0\.0, every interface"):
        reach_controller(cfg, {})


def test_the_users_master_addr_wins_as_master_port_does(sshd):
    with _ssh_mesh(sshd, gpus=1, env={"MASTER_ADDR": "10.9.8.7", "MASTER_PORT": "29555"}) as mesh:
        got = mesh.run("import os\n(os.environ['MASTER_ADDR'], os.environ['MASTER_PORT'])").values()
        assert [tuple(g) for g in got] == [("10.9.8.7", "29555")] * 2
