"""What a user sees when an ssh mesh cannot start: the host named, ssh's own words, and what to
do, within a second (a real sshd, real ssh; hosts as network namespaces where a host must be
another machine)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time

import pytest

import viceroy as vr
from tests.launchers.conftest import SSH_OPTS


def _start(sshd, python=None, identity=None, options=SSH_OPTS, port=None):
    return vr.Mesh.ssh(
        ["127.0.0.1"], port=port or sshd.port, identity=identity or sshd.identity, ssh_options=options,
        python=python, preload=[], echo=False, gpus=2, startup_timeout=30,
    )


def _refused(start, *patterns):
    t0 = time.monotonic()
    with pytest.raises(RuntimeError) as info:
        start().shutdown()
    assert time.monotonic() - t0 < 10
    message = str(info.value)
    assert message.startswith("the mesh did not start: host 0 (127.0.0.1, via ssh) lost"), message
    for p in patterns:
        assert p in message, message
    # The host's last words once, in its reason: never again as a live host's log (its two ranks
    # die one after the other; the mesh must not read the loss half done).
    assert "agent logs:" not in message, message
    return message


def test_a_python_missing_on_the_host_is_named_with_ssh_words_and_what_to_do(sshd):
    # The agent's log goes with it once the host is given up: its last words must be in the
    # error every time, not only when the error is read first (it raced).
    for _ in range(4):
        _refused(lambda: _start(sshd, python="/nonexistent/python"),
                 "/nonexistent/python: No such file or directory", "there is no /nonexistent/python on 127.0.0.1",
                 "python=PATH on its hostfile line")


def test_a_python_without_viceroy_is_named(sshd):
    bare = os.path.realpath(sys.executable)  # the venv's base interpreter: no viceroy
    if subprocess.run([bare, "-c", "import viceroy"], capture_output=True, env={}).returncode == 0:
        pytest.skip(f"{bare} has viceroy installed")
    _refused(lambda: _start(sshd, python=bare), "No module named", f"{bare} on 127.0.0.1 lacks viceroy",
             "pip install viceroy-kernel there")


def test_a_login_that_wants_a_password_never_prompts_and_says_what_to_do(sshd):
    wrong_key = os.path.join(os.path.dirname(sshd.identity), "host_key")  # a key sshd does not accept
    _refused(lambda: _start(sshd, identity=wrong_key), "Permission denied",
             f"never types a password (BatchMode): make `ssh -p {sshd.port} 127.0.0.1 true` work", "ssh-copy-id")


def test_an_unknown_host_key_is_explained(sshd):
    strict = ["-o", "StrictHostKeyChecking=yes", "-o", "UserKnownHostsFile=/dev/null"]
    _refused(lambda: _start(sshd, options=strict), "Host key verification failed",
             "host key is not in known_hosts", f"`ssh -p {sshd.port} 127.0.0.1` once")


def test_no_sshd_listening_is_explained(sshd):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        _refused(lambda: _start(sshd, port=port), "Connection refused", f"sshd listening on port {port}?")


def test_users_ssh_options_win_over_the_defaults_but_never_batch_mode():
    from viceroy.runtime.ssh import SshLauncher

    launcher = SshLauncher(["node1"], options=("-o", "ConnectTimeout=45", "-o", "BatchMode=no",
                                               "-o", "ServerAliveCountMax=9"))
    seen = subprocess.run([*launcher.ssh_base(), "-G", "node1"], capture_output=True, text=True, check=True).stdout
    settings = dict(ln.split(None, 1) for ln in seen.splitlines() if " " in ln)
    assert settings["connecttimeout"] == "45"  # it was 10 whatever the user said
    assert settings["serveralivecountmax"] == "9"
    assert settings["batchmode"] == "yes"  # never a password prompt
    plain = subprocess.run([*SshLauncher(["node1"]).ssh_base(), "-G", "node1"], capture_output=True, text=True).stdout
    assert "connecttimeout 10" in plain and "serveraliveinterval 1" in plain


def test_a_controller_on_loopback_is_refused_for_hosts_that_are_other_machines(ns_hosts):
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=r"host 0 \(10\.213\.1\.2\) is another machine, but the controller "
                                         r"listens on 127\.0\.0\.1 \(loopback\).*interface=ADDR.*--listen ADDR"):
        vr.Mesh.ssh(ns_hosts.addresses, port=ns_hosts.port, identity=ns_hosts.identity, ssh_options=SSH_OPTS,
                    preload=[], echo=False, gpus=1)  # no interface=: it waited 10 s for the agent to give up
    assert time.monotonic() - t0 < 5


def test_a_host_that_cannot_be_reached_is_named_with_what_to_do(ns_hosts):
    from tests.launchers.netns import CONTROLLER_ADDR

    ns_hosts.net.cut(2)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"host 1 \(10\.213\.2\.2, via ssh\) lost.*\n.*No route to host\n"
                                           r"10\.213\.2\.2 did not take the ssh connection: is it up"):
        vr.Mesh.ssh(ns_hosts.addresses, port=ns_hosts.port, identity=ns_hosts.identity, ssh_options=SSH_OPTS,
                    interface=CONTROLLER_ADDR, preload=[], echo=False, gpus=1)
    assert time.monotonic() - t0 < 10


def test_a_command_that_exits_before_reading_its_configuration_is_reported_not_raised():
    """ssh with no route to the host exits before it reads the configuration written to its
    stdin: the launch must not raise a BrokenPipeError (it did, now and then, in the test
    above); the command's exit is what the user hears of. A configuration larger than a pipe
    holds makes the broken pipe certain here."""
    from viceroy.runtime.launcher import start_child_agent

    agent = start_child_agent([sys.executable, "-c", "import sys; sys.exit(255)"], {"pad": "x" * (1 << 20)}, host=0)
    try:
        assert agent.wait(timeout=30) == 255
    finally:
        agent.kill()


def test_a_host_name_is_not_taken_for_a_missing_hostfile():
    with pytest.raises(FileNotFoundError, match=r"Mesh.ssh\('node1'\): there is no hostfile 'node1' here; a host name "
                                                r"goes in a list, Mesh.ssh\(\['node1'\], \.\.\.\)"):
        vr.Mesh.ssh("node1", gpus=1)


def test_a_hostfile_as_a_path_with_a_python_under_the_remote_home(sshd, tmp_path):
    # A hostfile's python=~/venv/bin/python is the remote user's (it was quoted, so not expanded:
    # "No such file or directory"); a pathlib.Path names a hostfile as a str does (it was iterated).
    import pathlib
    import pwd

    home = pwd.getpwuid(os.getuid()).pw_dir  # where sshd logs this user in
    hostfile = tmp_path / "hosts.txt"
    hostfile.write_text(f"127.0.0.1 python=~/{os.path.relpath(sys.executable, home)}  # under ~\n")
    mesh = vr.Mesh.ssh(pathlib.Path(hostfile), port=sshd.port, identity=sshd.identity, ssh_options=SSH_OPTS,
                       preload=[], echo=False, gpus=1, startup_timeout=30)
    try:
        assert mesh.run("rank").values() == [0]
    finally:
        mesh.shutdown()


def test_the_magic_says_listen_when_its_hosts_are_other_machines(ns_hosts, tmp_path, monkeypatch):
    from IPython.core.error import UsageError

    from viceroy.extension.session import MeshSession

    hostfile = tmp_path / "hosts.txt"
    hostfile.write_text("\n".join(ns_hosts.addresses) + "\n")
    monkeypatch.setenv("VICEROY_SSH_OPTIONS", " ".join([*SSH_OPTS, "-p", str(ns_hosts.port), "-i", ns_hosts.identity]))
    session = MeshSession(None)
    try:  # a one-line UsageError, not a traceback
        with pytest.raises(UsageError, match=r"^%mesh up --launcher ssh: host 0 \(10\.213\.1\.2\) is another machine.*"
                                             r"--listen ADDR$"):
            session.up({"hosts": 2, "gpus": 1}, launcher="ssh", hostfile=str(hostfile), preload=[])
    finally:
        session.close()


def test_many_agents_through_one_sshd_get_past_its_maxstartups(tmp_path):
    # sshd resets connections beyond MaxStartups still logging in (default 10:30:100; here 2)
    from tests.launchers.conftest import _free_port, _need_sshd, start_sshd

    _need_sshd()
    port = _free_port()
    proc = start_sshd(tmp_path, "127.0.0.1", port, extra="MaxStartups 2\n")
    try:
        mesh = vr.Mesh.ssh(["127.0.0.1"] * 8, port=port, identity=str(tmp_path / "client_key"), ssh_options=SSH_OPTS,
                           preload=[], echo=False, gpus=1, startup_timeout=90)
        try:
            assert mesh.run("rank").values() == list(range(8))
        finally:
            mesh.shutdown()
    finally:
        proc.kill()
        proc.wait()


def test_a_session_cut_after_its_agent_said_hello_is_not_started_again():
    # ssh's words for a running session that was reset are those of sshd turning a login away
    # (MaxStartups), which is tried again; after the agent reached the controller they mean a
    # lost host: a second agent would bring up empty ranks the controller takes for the old ones.
    from viceroy.runtime.launcher import start_child_agent
    from viceroy.runtime.ssh import SshAgent

    cut = "echo 'client_loop: send disconnect: Connection reset by peer' >&2; exit 255"
    spawned = []

    def spawn():
        spawned.append(start_child_agent(["sh", "-c", cut], {}, 0))
        return spawned[-1]

    agent = SshAgent(spawn, lambda timeout: None)
    try:
        agent.said_hello()
        assert agent.wait(30) == 255
        assert len(spawned) == 1, "a session that ran was started again"
        assert "Connection reset by peer" in agent.log_tail()
    finally:
        agent.kill()
        for child in spawned:
            child.wait(10)


def test_a_launch_that_never_logged_in_stays_so_after_its_agent_was_killed():
    # The watch thread's wait saw "Connection refused" and knew nothing ran there; the lost
    # host's agent was then killed (its log with it), and the shutdown's own wait read the log
    # again, found nothing, and ran a second ssh "to end the old agent", which warned that it
    # and its ranks "may still run there" (a CI run, 2026-12-03).
    from viceroy.runtime.launcher import start_child_agent
    from viceroy.runtime.ssh import SshAgent

    refused = "echo 'ssh: connect to host 127.0.0.1 port 9: Connection refused' >&2; exit 255"
    ended = []
    agent = SshAgent(lambda: start_child_agent(["sh", "-c", refused], {}, 0), lambda timeout: ended.append(1))
    assert agent.wait(30) == 255
    agent.kill()
    assert agent.wait(30) == 255
    assert agent.end_remains(5) is None and ended == [], "a second ssh to end what never ran"


def test_an_sshd_that_keeps_turning_connections_away_is_explained():
    from viceroy.runtime.ssh import SshHost, SshLauncher

    words = "kex_exchange_identification: read: Connection reset by peer"
    advice = SshLauncher([SshHost("node1")]).advice(SshHost("node1"), "tcp://10.0.0.1:5555", words)
    assert "MaxStartups" in advice and "node1" in advice


def test_a_host_that_does_not_start_in_time_is_named_and_each_log_is_labelled(sshd, tmp_path):
    import psutil

    from tests.conftest import wait_until
    from viceroy.runtime.ssh import SshHost

    slow = tmp_path / "slowpy.sh"  # a "Python" that never gets going (it ends when ssh does)
    slow.write_text("#!/bin/sh\necho 'slowpy: loading modules...' >&2\ncat >/dev/null\n")
    slow.chmod(0o755)
    with pytest.raises(RuntimeError) as info:
        vr.Mesh.ssh([SshHost("127.0.0.1"), SshHost("localhost", str(slow))], port=sshd.port, identity=sshd.identity,
                    ssh_options=SSH_OPTS, preload=[], echo=False, gpus=1, startup_timeout=4).shutdown()
    msg = str(info.value)
    assert "rank 1 did not start within 4 s (on host 1 (localhost, via ssh))" in msg
    assert "host 1 (localhost, via ssh):\n  slowpy: loading modules..." in msg
    wait_until(lambda: not psutil.Process(sshd.pid).children(recursive=True), 10, "the sessions to end")


@pytest.mark.parametrize("value", ["3s", "0", "-1", "nan"])
def test_a_bad_host_timeout_is_refused_naming_the_variable(sshd, monkeypatch, value):
    monkeypatch.setenv("VICEROY_HOST_TIMEOUT", value)
    with pytest.raises(ValueError, match=rf"VICEROY_HOST_TIMEOUT={value!r}: give a positive number of seconds"):
        _start(sshd).shutdown()


def test_no_ssh_connection_advice_names_the_port_ssh_really_uses(sshd, tmp_path, monkeypatch):
    closed = _free_port_here()  # nothing listens there
    config = tmp_path / "ssh_config"
    config.write_text(f"Host node1\n  HostName 127.0.0.1\n  Port {closed}\n")
    monkeypatch.setenv("VICEROY_SSH_OPTIONS", f"-F {config}")
    with pytest.raises(RuntimeError) as info:
        vr.Mesh.ssh(["node1"], identity=sshd.identity, ssh_options=SSH_OPTS, preload=[], echo=False, gpus=1,
                    startup_timeout=30).shutdown()
    assert f"is sshd listening on port {closed}?" in str(info.value)
    assert "port 22?" not in str(info.value)


def _free_port_here() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_refused_login_names_both_ways_to_give_a_key():
    from viceroy.runtime.ssh import SshLauncher

    launcher = SshLauncher(["node1"], port=2222)
    words = "node1: Permission denied (publickey)."
    assert launcher.advice(launcher.hosts[0], "tcp://10.0.0.1:5555", words) == (  # type: ignore[arg-type]
        "node1 refused the login and the ssh launcher never types a password (BatchMode): make "
        "`ssh -p 2222 node1 true` work without one (ssh-copy-id node1, ssh-add), or give it a key: "
        "identity=KEYFILE in Mesh.ssh, --identity KEYFILE in %mesh up")


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"hosts": ["node1", ""]}, ValueError, "host 1 (''): a host name cannot be empty"),
    ({"hosts": ["node1", 5]}, ValueError, "host 1 (5): a host is named by a string, e.g. 'node1'"),
    ({"hosts": ["-oProxyCommand=touch x"]}, ValueError,
     "host 0 ('-oProxyCommand=touch x'): a host name cannot start with '-' (ssh would read it as an option"),
    ({"hosts": ["node 1"]}, ValueError, "host 0 ('node 1'): a host name holds no spaces"),
    ({"hosts": 5}, TypeError, "hosts=5: give a list of host names"),
    ({"hosts": {"node1", "node2"}}, TypeError, "hosts={'node"),  # in no order: which is host 0?
    ({"port": "22"}, ValueError, "port='22': give sshd's port number (1-65535)"),
    ({"port": 0}, ValueError, "port=0: give sshd's port number (1-65535)"),
    ({"port": 70000}, ValueError, "port=70000: give sshd's port number (1-65535)"),
    ({"port": True}, ValueError, "port=True: give sshd's port number (1-65535)"),
    ({"ssh_options": "-o ProxyJump=gw"}, TypeError, "ssh_options='-o ProxyJump=gw': give a list of ssh's arguments"),
    ({"ssh_options": ["-p", 2222]}, TypeError, "ssh_options=['-p', 2222]: give a list of ssh's arguments"),
    ({"identity": 5}, TypeError, "identity=5: give the path of the private key file"),
    ({"identity": "/nonexistent/key"}, FileNotFoundError, "identity='/nonexistent/key': no such file; name the private"),
    ({"python": ""}, ValueError, "python='': give the path of the hosts' Python"),
    ({"python": 3}, ValueError, "python=3: give the path of the hosts' Python"),
    ({"interface": 5}, TypeError, "interface=5: give an address of this machine"),  # "str, bytes or bytearray expected"
])
def test_bad_ssh_arguments_are_refused_naming_them_before_anything_starts(nothing_may_start, kwargs, error, message):
    # They reached ssh (port=0: "Bad port '0'"; a string of options: one letter per argument; a
    # missing key: a warning, then a login that fails), or failed inside (an IndexError).
    kwargs = {"hosts": ["node1"], **kwargs}
    with pytest.raises(error) as info:
        vr.Mesh.ssh(kwargs.pop("hosts"), gpus=1, preload=[], echo=False, **kwargs)
    assert str(info.value).startswith(message), str(info.value)


@pytest.mark.parametrize(("line", "message"), [
    ("-oProxyCommand=x", "'-oProxyCommand=x': a host name cannot start with '-'"),
    ("node1 python=", "python= names no Python"),
])
def test_a_hostfile_line_ssh_would_misread_is_refused_naming_the_line(tmp_path, line, message):
    hostfile = tmp_path / "hosts.txt"
    hostfile.write_text(f"node0\n{line}\n")
    with pytest.raises(ValueError, match=rf"^{re.escape(f'{hostfile}:2: {message}')}"):
        vr.Mesh.ssh(str(hostfile), gpus=1)


@pytest.mark.parametrize("host", ["127.0.0.1", "nosuchhost.invalid"])
def test_a_host_ssh_never_logged_in_to_is_not_said_to_have_leftovers(sshd, capfd, host):
    # ssh that could not connect (or resolve the name) ran nothing there: the shutdown tried a
    # second ssh "to end the old agent", failed alike, and warned that the agent and its ranks
    # "may still run there", with a grep to find them.
    closed = _free_port_here()
    with pytest.raises(RuntimeError, match=r"host 0 \(.*, via ssh\) lost"):
        vr.Mesh.ssh([host], port=closed, identity=sshd.identity, ssh_options=SSH_OPTS, preload=[], echo=False,
                    gpus=1, startup_timeout=30).shutdown()
    err = capfd.readouterr().err
    assert "may still run there" not in err and "could not end the old agent" not in err, err


def test_options_ssh_refuses_are_refused_before_any_host_is_started(capfd):
    # Each host's ssh failed alike ("Bad configuration option"), and each was then "ended" over
    # another ssh that failed alike, each warning that its agent "may still run there".
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=r"^ssh refuses its options \(command-line: line 0: Bad configuration option: "
                                         r"bogus\): check ssh_options=\['-o', 'Bogus=1'\]"):
        vr.Mesh.ssh(["127.0.0.1", "127.0.0.1"], ssh_options=["-o", "Bogus=1"], preload=[], echo=False, gpus=1,
                    startup_timeout=30).shutdown()
    assert time.monotonic() - t0 < 5
    assert "may still run there" not in capfd.readouterr().err


def test_hosts_may_come_from_any_ordered_iterable(nothing_may_start):
    # (a generator, dict keys: in order) they get as far as starting the mesh
    for hosts in (iter(["node1", "node2"]), {"node1": 8, "node2": 8}.keys()):
        with pytest.raises(AssertionError, match="before refusing the arguments"):
            vr.Mesh.ssh(hosts, gpus=1, preload=[], echo=False)


@pytest.mark.parametrize("kind", ["not executable", "a directory", "missing"])
def test_a_python_the_host_cannot_run_is_named_as_such_and_left_nothing(sshd, tmp_path, capfd, kind):
    # A Python without the x bit got the advice for a refused login ("Permission denied"); and
    # the shell that could not run it ran nothing, yet the shutdown warned that the agent and
    # its ranks "may still run there" (the second ssh, with the same Python, failed alike).
    python = {"not executable": tmp_path / "python", "a directory": tmp_path, "missing": tmp_path / "nope"}[kind]
    if kind == "not executable":
        python.write_text("#!/bin/sh\n")
        python.chmod(0o644)
    message = _refused(lambda: _start(sshd, python=str(python)))
    if kind != "missing":
        assert f"{python} on 127.0.0.1 cannot be run there (not an executable file): name that host's Python" in message
        assert "refused the login" not in message
    assert "may still run there" not in capfd.readouterr().err
