"""`%mesh up --launcher ssh|slurm|attach` options and `%mesh sync` (rsync over the mesh's ssh)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading

import pytest
from IPython.core.error import UsageError

from tests.launchers.conftest import SSH_OPTS
from viceroy.extension.args import parse_command
from viceroy.extension.launching import check_launcher_options
from viceroy.extension.session import MeshSession


def test_up_parses_the_launcher_options():
    cmd = parse_command("up hosts=2 gpus=1 --launcher attach --listen 0.0.0.0:7777 --key-file mesh.key")
    assert (cmd.launcher, cmd.listen, cmd.key_file, cmd.dims) == ("attach", "0.0.0.0:7777", "mesh.key", {"hosts": 2, "gpus": 1})
    assert parse_command("up gpus=8 --launcher slurm").launcher == "slurm"
    with pytest.raises(UsageError, match="invalid choice: 'k8s'"):
        parse_command("up gpus=1 --launcher k8s")
    cmd = parse_command("sync src --to /scratch/me --dry-run")
    assert (cmd.sync_src, cmd.sync_dest, cmd.dry_run) == ("src", "/scratch/me", True)
    assert parse_command("sync").sync_src == "."


@pytest.mark.parametrize(("launcher", "opts", "message"), [
    ("local", {"key_file": "k"}, "--key-file goes with --launcher attach"),
    ("slurm", {"hostfile": "h"}, "--hostfile goes with --launcher ssh"),
    ("local", {"listen": "0.0.0.0:1"}, "--listen goes with --launcher ssh, slurm or attach"),
    ("attach", {}, "needs hosts=N"),
])
def test_options_that_do_not_go_together_are_explained(launcher, opts, message):
    with pytest.raises(UsageError, match=message):
        check_launcher_options(launcher, {"gpus": 1}, opts.get("hostfile"), opts.get("listen"), opts.get("key_file"))


def test_the_magic_waits_for_attached_agents(tmp_path, capsys):
    key_file = str(tmp_path / "mesh.key")
    cmd = parse_command(f"up hosts=1 gpus=2 --launcher attach --listen 127.0.0.1:7792 --key-file {key_file} --preload none")
    agents: list[subprocess.Popen[bytes]] = []

    def start_agent() -> None:
        while not os.path.exists(key_file):
            threading.Event().wait(0.05)
        agents.append(subprocess.Popen([sys.executable, "-m", "viceroy", "agent", "--connect", "127.0.0.1:7792",
                                        "--key-file", key_file], stdin=subprocess.DEVNULL))

    t = threading.Thread(target=start_agent)
    t.start()
    session = MeshSession(None)
    try:
        mesh = session.up(cmd.dims, launcher=cmd.launcher, listen=cmd.listen, key_file=cmd.key_file, preload=[])
        assert "viceroy agent --connect 127.0.0.1:7792" in capsys.readouterr().out
        assert mesh.run("rank").values() == [0, 1]
        with pytest.raises(UsageError, match=r"%mesh sync copies files to the hosts of an ssh mesh.*launcher: attach"):
            session.sync(".", None, False)
    finally:
        session.close()
        t.join()
        for a in agents:
            a.wait(timeout=10)


def test_sync_copies_the_directory_to_every_host_over_ssh(sshd, tmp_path, monkeypatch):
    src, dest = tmp_path / "project", tmp_path / "remote" / "project"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "model.py").write_text("WIDTH = 7\n")
    (src / ".git").mkdir()
    (src / ".git" / "HEAD").write_text("ref\n")
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("127.0.0.1\n")
    config = tmp_path / "ssh_config"
    config.write_text(f"Host 127.0.0.1\n  Port {sshd.port}\n  IdentityFile {sshd.identity}\n"
                      "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n")
    monkeypatch.setenv("VICEROY_SSH_OPTIONS", f"-F {config}")
    session = MeshSession(None)
    try:
        session.up({"hosts": 1, "gpus": 1}, launcher="ssh", hostfile=str(hosts), preload=[])
        assert list(map(str, session.sync(str(src), str(dest), dry_run=True))) == [f"127.0.0.1:{dest} (would copy 1 file(s))"]
        assert not dest.exists()
        assert list(map(str, session.sync(str(src), str(dest), dry_run=False))) == [f"127.0.0.1:{dest}"]
        assert (dest / "pkg" / "model.py").read_text() == "WIDTH = 7\n"
        assert not (dest / ".git").exists()
        # the ranks can import what was synced
        assert session.mesh.run(f"import sys\nsys.path.insert(0, {str(dest)!r})\nimport pkg.model\npkg.model.WIDTH").values() == [7]
        with pytest.raises(UsageError, match="is not a directory"):
            session.sync(str(tmp_path / "nope"), None, False)
    finally:
        session.close()


def test_ssh_and_rsync_share_the_hosts_ssh_options():
    from viceroy.runtime.ssh import SshLauncher

    launcher = SshLauncher(["node1"], port=2222, identity="/k", options=SSH_OPTS)
    argv = launcher.rsync_argv(launcher.hosts[0], "/data/project", "/data/project")  # type: ignore[arg-type]
    ssh = argv[argv.index("-e") + 1]
    assert "-p 2222 -i /k" in ssh and "StrictHostKeyChecking=no" in ssh
    assert argv[-2:] == ["/data/project/", "node1:/data/project/"]


def test_up_parses_the_ssh_and_slurm_options():
    cmd = parse_command('up hosts=2 gpus=1 --launcher ssh --hostfile h --identity ~/.ssh/k --ssh-port 2222 '
                        '--ssh-options "-o ProxyJump=gw -v"')
    assert cmd.launcher_options == {"--identity": "~/.ssh/k", "--ssh-port": 2222, "--ssh-options": "-o ProxyJump=gw -v"}
    cmd = parse_command('up hosts=2 gpus=1 --launcher slurm --salloc-options "-p gpu -t 60" '
                        '--srun-options=--exclusive --agents-per-node 2')
    assert cmd.launcher_options == {"--salloc-options": "-p gpu -t 60", "--srun-options": "--exclusive",
                                    "--agents-per-node": 2}
    assert parse_command("up gpus=1").launcher_options == {}


def test_ssh_and_slurm_options_map_onto_the_launchers_keywords(tmp_path):
    hostfile, key = tmp_path / "hosts", tmp_path / "id"
    hostfile.write_text("node1\nnode2\n")
    key.write_text("")
    opts = {"--identity": str(key), "--ssh-port": 2222, "--ssh-options": "-o ProxyJump=gw -v"}
    assert check_launcher_options("ssh", {"hosts": 2}, str(hostfile), None, None, opts) == {
        "identity": str(key), "port": 2222, "ssh_options": ["-o", "ProxyJump=gw", "-v"]}
    opts = {"--salloc-options": "-p gpu -t 60", "--srun-options": "--exclusive", "--agents-per-node": 2}
    assert check_launcher_options("slurm", {"hosts": 2}, None, None, None, opts) == {
        "salloc_options": ["-p", "gpu", "-t", "60"], "srun_options": ["--exclusive"], "agents_per_node": 2}


@pytest.mark.parametrize(("launcher", "opts", "message"), [
    ("local", {"--identity": "k"}, "%mesh up: --identity goes with --launcher ssh"),
    ("slurm", {"--ssh-options": "-v"}, "%mesh up: --ssh-options goes with --launcher ssh"),
    ("ssh", {"--salloc-options": "-p gpu"}, "%mesh up: --salloc-options goes with --launcher slurm"),
    ("attach", {"--agents-per-node": 2}, "%mesh up: --agents-per-node goes with --launcher slurm"),
    ("slurm", {"--agents-per-node": 0}, "%mesh up: --agents-per-node takes a positive number, got 0"),
    # (the running mesh was stopped first)
    ("slurm", {"--agents-per-node": 2}, "%mesh up: hosts=1 does not split into nodes of --agents-per-node 2"),
    ("ssh", {"--ssh-port": 70000}, "%mesh up: --ssh-port takes a port number 1-65535, got 70000"),
    ("ssh", {"--ssh-options": "-o 'Proxy"}, "%mesh up: --ssh-options \"-o 'Proxy\": No closing quotation"),
    ("ssh", {"--identity": "/nonexistent/key"}, "%mesh up: --identity /nonexistent/key: No such file or directory"),
    # ssh's own refusal came once the running mesh was stopped, from every host
    ("ssh", {"--ssh-options": "-o Bogus=1"},
     "%mesh up: ssh refuses its options (command-line: line 0: Bad configuration option: bogus)"),
])
def test_ssh_and_slurm_options_for_another_launcher_or_bad_values_are_refused(tmp_path, launcher, opts, message):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1\n")
    with pytest.raises(UsageError, match=f"^{re.escape(message)}"):
        check_launcher_options(launcher, {"hosts": 1, "gpus": 1}, str(hostfile) if launcher == "ssh" else None,
                               None, None, opts)


def test_what_can_be_checked_before_starting_is_checked_naming_the_option(tmp_path):
    bad = tmp_path / "bad-hosts"
    bad.write_text("node1 gpus=8\n")
    good = tmp_path / "hosts"
    good.write_text("node1\n")
    cases = [
        ("ssh", {"hosts": 1}, {"hostfile": "/nonexistent.txt"},
         "%mesh up: --hostfile /nonexistent.txt: No such file or directory"),
        ("ssh", {"hosts": 1}, {"hostfile": str(tmp_path)}, f"%mesh up: --hostfile {tmp_path}: Is a directory"),
        ("ssh", {"hosts": 1}, {"hostfile": str(bad)},
         f"%mesh up: --hostfile {bad}:1: unknown host option 'gpus=8' (only python=PATH)"),
        ("ssh", {"hosts": 2}, {"hostfile": str(good)}, f"%mesh up: hosts=2 but --hostfile {good} lists 1 host(s)"),
        ("attach", {"hosts": 1}, {"listen": "0.0.0.0"},
         "%mesh up: --listen for --launcher attach takes HOST:PORT, e.g. 0.0.0.0:7777; got '0.0.0.0'"),
        ("attach", {"hosts": 1}, {"listen": "0.0.0.0:99999"},  # zmq took it, and listened on another port
         "%mesh up: --listen for --launcher attach takes HOST:PORT, e.g. 0.0.0.0:7777; got '0.0.0.0:99999' "
         "(99999 is not a port number (1-65535))"),
        ("attach", {"hosts": 1}, {"key_file": "/nonexistent/mesh.key"},
         "%mesh up: --key-file /nonexistent/mesh.key: there is no directory /nonexistent to create it in"),
        ("attach", {"hosts": 1}, {"key_file": str(tmp_path)},
         f"%mesh up: --key-file {tmp_path} is a directory; --key-file names the mesh's key file"),
        # the running mesh was stopped first, then the new one refused: "interface='...': ..."
        ("ssh", {"hosts": 1}, {"hostfile": str(good), "listen": "nosuchhost.invalid"},
         "%mesh up: --listen nosuchhost.invalid: the controller cannot listen there"),
        ("slurm", {"hosts": 1}, {"listen": "nosuchhost.invalid"},
         "%mesh up: --listen nosuchhost.invalid: the controller cannot listen there"),
        # (attach's --listen has a port: ssh's and slurm's do not) "Name or service not known"
        ("ssh", {"hosts": 1}, {"hostfile": str(good), "listen": "127.0.0.1:7777"},
         "%mesh up: --listen 127.0.0.1:7777: give the address alone, '127.0.0.1'; the controller picks its own ports"),
    ]
    for launcher, dims, opts, message in cases:
        with pytest.raises(UsageError, match=f"^{re.escape(message)}"):
            check_launcher_options(launcher, dims, opts.get("hostfile"), opts.get("listen"), opts.get("key_file"))
