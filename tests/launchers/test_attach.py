"""Attach mode: agents started by something else (here, the test) connect to a mesh that waits
for them. The key comes from a 0600 file or an environment variable, never a command line."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import psutil
import pytest

import viceroy as vr
from tests.conftest import live_pids, wait_until


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _agent(addr: str, *args: str, env: dict[str, str] | None = None, prefix: list[str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*(prefix or []), sys.executable, "-m", "viceroy", "agent", "--connect", addr, *args],
        stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})},
    )


def _attach_later(addr: str, n: int, *args: str, **kw) -> tuple[list[subprocess.Popen[str]], threading.Thread]:
    """Start `n` agents once the mesh is waiting (as a cluster's own launcher would)."""
    procs: list[subprocess.Popen[str]] = []
    t = threading.Thread(target=lambda: procs.extend(_agent(addr, *args, **kw) for _ in range(n)))
    t.start()
    return procs, t


def _reap(procs: list[subprocess.Popen[str]]) -> list[int]:
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=15))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append(p.wait())
    return codes


def test_agents_started_by_anything_attach_to_a_waiting_mesh(tmp_path, capsys):
    key_file, port = str(tmp_path / "mesh.key"), _port()
    procs, t = _attach_later(f"127.0.0.1:{port}", 2, "--key-file", key_file)
    try:
        mesh = vr.Mesh.attach(hosts=2, gpus=2, listen=f"127.0.0.1:{port}", key_file=key_file, preload=[])
        t.join()
        try:
            assert os.stat(key_file).st_mode & 0o777 == 0o600  # made for us, private
            assert f"viceroy agent --connect 127.0.0.1:{port} --key-file {key_file}" in capsys.readouterr().out
            assert mesh.run("rank * 10").values() == [0, 10, 20, 30]
            assert mesh.run("coords['hosts']").values() == [0, 0, 1, 1]
            agents = {psutil.Process(p).parent().pid for p in mesh.pids().values()}
            assert agents == {p.pid for p in procs}  # the ranks hang off the agents we started
            with open(key_file) as f:
                key = f.read().strip()
            for p in psutil.process_iter(["cmdline"]):
                assert key not in " ".join(p.info["cmdline"] or [])
            # a third agent is told the mesh is full
            extra = _agent(f"127.0.0.1:{port}", "--key-file", key_file)
            assert extra.wait(timeout=30) == 1
            assert "refused this agent: every host of this mesh has an agent already" in extra.stderr.read()
        finally:
            mesh.shutdown()
    finally:
        t.join()
        assert _reap(procs) == [0, 0]


def test_the_users_master_addr_wins_over_the_address_host_0_reached_us_by(tmp_path):
    key_file, port = str(tmp_path / "mesh.key"), _port()
    procs, t = _attach_later(f"127.0.0.1:{port}", 2, "--key-file", key_file)
    try:
        with vr.Mesh.attach(hosts=2, gpus=1, listen=f"127.0.0.1:{port}", key_file=key_file, preload=[],
                            echo=False, env={"MASTER_ADDR": "10.9.8.7"}) as mesh:
            assert mesh.run("import os\nos.environ['MASTER_ADDR']").values() == ["10.9.8.7"] * 2
    finally:
        t.join()
        _reap(procs)


def test_the_key_can_come_from_the_environment(tmp_path, monkeypatch):
    key, port = os.urandom(32).hex(), _port()
    monkeypatch.setenv("VICEROY_MESH_KEY", key)
    procs, t = _attach_later(f"127.0.0.1:{port}", 1)
    try:
        with vr.Mesh.attach(hosts=1, gpus=1, listen=f"127.0.0.1:{port}", preload=[], echo=False) as mesh:
            assert mesh._controller.signer.key.hex() == key
            assert mesh.run("rank").values() == [0]
    finally:
        t.join()
        _reap(procs)


def test_bad_keys_are_explained(tmp_path):
    loose = tmp_path / "loose.key"
    loose.write_text(os.urandom(32).hex())
    loose.chmod(0o644)
    p = _agent("127.0.0.1:9", "--key-file", str(loose))
    assert p.wait(timeout=30) == 1
    assert f"{loose} is readable by others (mode 644); the mesh key must be private: chmod 600" in p.stderr.read()
    p = _agent("127.0.0.1:9", env={"VICEROY_MESH_KEY": ""})
    assert p.wait(timeout=30) == 1
    assert "no mesh key: pass --key-file FILE (a 0600 file) or set $VICEROY_MESH_KEY" in p.stderr.read()


@pytest.mark.slow  # a controller waits out its startup timeout
def test_an_agent_with_another_key_is_ignored_and_says_why(tmp_path):
    port = _port()
    mine, theirs = tmp_path / "mine.key", tmp_path / "theirs.key"
    for f in (mine, theirs):
        f.write_text(os.urandom(32).hex())
        f.chmod(0o600)
    with pytest.raises(RuntimeError, match=r"(?s)did not start.*no agent attached; start one with `viceroy agent --connect"):
        vr.Mesh.attach(hosts=1, gpus=1, listen=f"127.0.0.1:{port}", key_file=str(mine), preload=[],
                       echo=False, startup_timeout=3)
    server = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import viceroy as vr
        try:
            vr.Mesh.attach(hosts=1, gpus=1, listen="127.0.0.1:{port}", key_file={str(mine)!r}, preload=[],
                           echo=False, startup_timeout=8)
        except RuntimeError:
            pass
    """)])
    try:
        p = _agent(f"127.0.0.1:{port}", "--key-file", str(theirs), "--wait", "2")
        assert p.wait(timeout=30) == 1
        assert "is this the mesh's key?" in p.stderr.read()
    finally:
        server.wait(timeout=30)


CONTROLLER = textwrap.dedent("""
    import json, sys, time, viceroy as vr
    mesh = vr.Mesh.attach(hosts=2, gpus=1, listen=sys.argv[1], key_file=sys.argv[2], preload=[], echo=False)
    mesh.run("import time\\ntime.sleep(60)", block=False)
    print(json.dumps(list(mesh.pids().values())), flush=True)
    time.sleep(120)
""")


@pytest.mark.slow  # waits out an agent's 10 s of silence
def test_controller_death_leaves_no_attached_agent_or_rank(tmp_path):
    key_file, port = str(tmp_path / "mesh.key"), _port()
    ctrl = subprocess.Popen([sys.executable, "-c", CONTROLLER, f"127.0.0.1:{port}", key_file], stdout=subprocess.PIPE, text=True)
    wait_until(lambda: os.path.exists(key_file), 30, "the controller to write the key file")
    procs = [_agent(f"127.0.0.1:{port}", "--key-file", key_file) for _ in range(2)]
    try:
        assert ctrl.stdout is not None
        assert ctrl.stdout.readline().startswith("viceroy: waiting for 2 agent(s)")
        ranks = json.loads(ctrl.stdout.readline())
        os.kill(ctrl.pid, signal.SIGKILL)
        ctrl.wait()
        t0 = time.monotonic()
        everything = ranks + [p.pid for p in procs]
        wait_until(lambda: not live_pids(everything), 15, f"the agents and ranks to exit: {live_pids(everything)}")
        assert time.monotonic() - t0 < 13
        assert "nothing from the controller" in procs[0].stderr.read()
    finally:
        if ctrl.poll() is None:
            ctrl.kill()
            ctrl.wait()
        _reap(procs)


def test_cli_mistakes_name_the_value_at_fault_and_what_to_do(tmp_path):
    p = _agent("127.0.0.1:9", "--key-file", str(tmp_path / "mesh.key"))
    assert p.wait(timeout=30) == 1
    assert f"no key file {tmp_path / 'mesh.key'}: copy the mesh's key file from the controller's machine" in p.stderr.read()
    p = _agent("127.0.0.1:9", "--key-file", str(tmp_path))
    assert p.wait(timeout=30) == 1
    assert f"{tmp_path} is a directory; --key-file names the mesh's key file" in p.stderr.read()
    p = _agent("nosuchhost.invalid:7777", "--wait", "1", env={"VICEROY_MESH_KEY": os.urandom(32).hex()})
    assert p.wait(timeout=30) == 1
    assert "cannot look up the controller's host 'nosuchhost.invalid'" in p.stderr.read()
    for wait in ("-1", "nan", "soon"):
        p = _agent("127.0.0.1:9", "--wait", wait)
        assert p.wait(timeout=30) == 2
        assert f"argument --wait: {wait!r}: give a positive number of seconds, e.g. --wait 120" in p.stderr.read()


def test_listening_on_every_interface_prints_a_name_other_hosts_can_use(tmp_path):
    from viceroy.runtime.attach import AttachLauncher

    port = _port()
    launcher = AttachLauncher(f"0.0.0.0:{port}", str(tmp_path / "mesh.key"))
    try:
        assert launcher.command().startswith(f"viceroy agent --connect {socket.gethostname()}:{port} --key-file ")
    finally:
        launcher.close()


def test_a_lost_hosts_new_agent_waits_for_restart_and_a_timed_out_restart_can_be_retried(tmp_path):
    key_file, port = str(tmp_path / "mesh.key"), _port()
    addr = f"127.0.0.1:{port}"
    procs, t = _attach_later(addr, 2, "--key-file", key_file)
    mesh = vr.Mesh.attach(hosts=2, gpus=1, listen=addr, key_file=key_file, preload=[], echo=False)
    t.join()
    try:
        by_pid = {p.pid: p for p in procs}
        host1 = by_pid[psutil.Process(mesh.pids()[1]).parent().pid]
        taken = _agent(addr, "--key-file", key_file, "--host", "1")
        assert taken.wait(timeout=30) == 1
        assert f"host 1 is not waiting for an agent (it has one: {socket.gethostname()}, pid {host1.pid})" in taken.stderr.read()
        host1.kill()
        wait_until(lambda: 1 in mesh._controller.lost_hosts(), 15, "host 1 to be given up")
        # nobody attaches in time: the host is given up again, saying how to attach one
        with pytest.raises(RuntimeError, match=r"(?s)rank 1 did not come back within 2 s.*host 1 .*no agent "
                           rf"came back within 2 s of mesh.restart.*start one with `viceroy agent --connect {addr}"):
            mesh.restart(failed_only=True, timeout=2)
        assert mesh.states()[1] == "dead"
        # an agent started (say, by Kubernetes) before the user restarts waits for the restart
        procs.append(_agent(addr, "--key-file", key_file))
        assert procs[-1].stderr is not None
        assert "waiting: host 1 was lost and waits for mesh.restart(failed_only=True)" in procs[-1].stderr.readline()
        mesh.restart(failed_only=True, timeout=30)
        assert mesh.run("rank").values() == [0, 1]
        assert psutil.Process(mesh.pids()[1]).parent().pid == procs[-1].pid
    finally:
        mesh.shutdown()
        codes = _reap(procs)
    assert codes[-1] == 0 and host1.returncode == -signal.SIGKILL


WAITING_CONTROLLER = textwrap.dedent("""
    import sys, viceroy as vr
    vr.Mesh.attach(hosts=2, gpus=1, listen=sys.argv[1], key_file=sys.argv[2], preload=[], echo=False)
""")


def test_an_agent_told_to_wait_says_when_its_controller_goes_away(tmp_path):
    key_file, port = str(tmp_path / "mesh.key"), _port()
    addr = f"127.0.0.1:{port}"
    ctrl = subprocess.Popen([sys.executable, "-c", WAITING_CONTROLLER, addr, key_file], stdout=subprocess.DEVNULL)
    try:
        wait_until(lambda: os.path.exists(key_file), 30, "the controller to write the key file")
        agent = _agent(addr, "--key-file", key_file, "--host", "1", "--wait", "3")
        assert agent.stderr is not None
        assert "waiting: host 0's agent attaches first" in agent.stderr.readline()  # host 0 is the rendezvous
        os.kill(ctrl.pid, signal.SIGKILL)
        ctrl.wait()
        assert agent.wait(timeout=30) == 1
        assert (f"the controller at {addr} stopped answering while this agent waited (host 0's agent attaches "
                "first") in agent.stderr.read()
    finally:
        if ctrl.poll() is None:
            ctrl.kill()
            ctrl.wait()


def _in_own_pid_namespace() -> list[str]:
    """A prefix that runs a command as pid 1 of a new PID namespace (as in a container)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) to give agents a PID namespace of their own")
    if subprocess.run(["unshare", "-p", "-f", "--mount-proc", "true"], capture_output=True).returncode != 0:
        pytest.skip("this machine does not allow new PID namespaces")
    return ["unshare", "-p", "-f", "--mount-proc"]


def test_agents_with_the_same_hostname_and_pid_get_hosts_of_their_own(tmp_path):
    # containers: every agent is pid 1, and hostNetwork pods share the node's name
    prefix = _in_own_pid_namespace()
    key_file, port = str(tmp_path / "mesh.key"), _port()
    procs, t = _attach_later(f"127.0.0.1:{port}", 2, "--key-file", key_file, "--wait", "30", prefix=prefix)
    try:
        with vr.Mesh.attach(hosts=2, gpus=1, listen=f"127.0.0.1:{port}", key_file=key_file, preload=[],
                            echo=False, startup_timeout=30) as mesh:
            t.join()
            # both agents are pid 1 (a rank is its agent's child once the middle process of its
            # double fork has exited: see zygote.py)
            wait_until(lambda: mesh.run("import os\nos.getppid()").values() == [1, 1], 10, "ranks whose parent is pid 1")
            assert mesh.run("rank").values() == [0, 1]
            # a restarted pod: its new agent is pid 1 on the same host again, and gets the
            # host that is waiting now, not its previous life's (cached) answer
            ns = mesh.run("os.readlink('/proc/self/ns/pid')").values()[1]  # host 1's container
            agents = [psutil.Process(p.pid).children()[0].pid for p in procs]  # unshare's child: pid 1 inside
            rundir = mesh._controller.agent_info[1]["endpoints"][0].removeprefix("ipc://").rsplit("/", 1)[0]
            os.kill(next(a for a in agents if os.readlink(f"/proc/{a}/ns/pid") == ns), signal.SIGKILL)
            wait_until(lambda: 1 in mesh._controller.lost_hosts(), 30, "host 1 to be given up")
            shutil.rmtree(rundir, ignore_errors=True)  # a killed agent leaves its socket directory
            procs.append(_agent(f"127.0.0.1:{port}", "--key-file", key_file, "--wait", "30", prefix=prefix))
            mesh.restart(failed_only=True, timeout=30)
            assert mesh.run("rank").values() == [0, 1]
    finally:
        t.join()
        _reap(procs)


def test_an_agent_that_took_its_config_and_went_silent_is_given_up_naming_its_host(tmp_path):
    # it died right after attaching, or a firewall lets only the attach port through
    from viceroy.runtime.attach_agent import request_config
    from viceroy.runtime.mesh_key import read_key

    key_file, port = str(tmp_path / "mesh.key"), _port()
    addr = f"127.0.0.1:{port}"
    procs, t = _attach_later(addr, 1, "--key-file", key_file, "--host", "0")
    taken: list[dict] = []

    def silent_agent() -> None:
        wait_until(lambda: os.path.exists(key_file), 30, "the controller to write the key file")
        taken.append(request_config(addr, read_key(key_file), want=1, wait=30))  # and nothing after

    silent = threading.Thread(target=silent_agent)
    silent.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match=r"(?s)host 1 \(.*attached\) lost: its agent took the host's "
                           r"configuration .* and was never heard from: .*cannot reach the mesh's other ports"):
            vr.Mesh.attach(hosts=2, gpus=1, listen=addr, key_file=key_file, preload=[], echo=False, startup_timeout=60)
        assert time.monotonic() - t0 < 30  # not the whole startup timeout
        assert taken and taken[0]["host"] == 1
    finally:
        t.join()
        silent.join()
        _reap(procs)


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    # zmq took port 99999 and listened on another: the mesh then waited out startup_timeout for
    # agents told to connect to a port that cannot be (and ~/.viceroy/attach-99999.key was made)
    ({"listen": "127.0.0.1:99999"}, ValueError, "listen='127.0.0.1:99999': 99999 is not a port number (1-65535)"),
    ({"listen": "127.0.0.1:0"}, ValueError, "listen='127.0.0.1:0': 0 is not a port number (1-65535)"),
    ({"listen": 7777}, TypeError, "listen=7777: expected HOST:PORT as a string"),  # an AttributeError
    # "waiting for 0 agent(s); on each host run ..." was printed, and a key file made, first
    ({"hosts": 0}, ValueError, "dim 'hosts' must be a positive int, got 0"),
    ({"gpus": True}, ValueError, "dim 'gpus' must be a positive int, got True"),
])
def test_bad_attach_arguments_are_refused_before_listening_or_making_a_key(tmp_path, capsys, kwargs, error, message):
    key = tmp_path / "mesh.key"
    kwargs = {"hosts": 1, "gpus": 1, "listen": f"127.0.0.1:{_port()}", **kwargs}
    with pytest.raises(error) as info:
        vr.Mesh.attach(key_file=str(key), preload=[], echo=False, startup_timeout=5, **kwargs)
    assert str(info.value).startswith(message), str(info.value)
    assert not key.exists()
    assert "waiting for" not in capsys.readouterr().out


def test_an_agent_told_a_port_that_cannot_be_says_so():
    p = _agent("127.0.0.1:99999", "--wait", "1", env={"VICEROY_MESH_KEY": os.urandom(32).hex()})
    assert p.wait(timeout=30) == 1
    assert "99999 is not a port number (1-65535), in '127.0.0.1:99999'" in p.stderr.read()


def test_a_key_file_with_no_directory_to_create_it_in_is_named(tmp_path):
    # "[Errno 2] No such file or directory: '.../k'": which file, and why it was being opened?
    key = tmp_path / "nonexistent" / "mesh.key"
    with pytest.raises(FileNotFoundError, match=rf"^key_file='{re.escape(str(key))}': there is no directory "
                                                rf"{re.escape(str(key.parent))} to create it in"):
        vr.Mesh.attach(hosts=1, gpus=1, listen=f"127.0.0.1:{_port()}", key_file=str(key), preload=[], echo=False)


def test_an_address_attach_cannot_listen_on_is_told_apart_from_a_port_in_use(tmp_path):
    # Both were "...; pick another port": no port helps an address that is not this machine's.
    port = _port()
    for listen in (f"[::1]:{port}", f"nosuchhost.invalid:{port}"):
        with pytest.raises(OSError, match=rf"^cannot listen on {re.escape(listen)} for agents: .*; give an IPv4 "
                                          rf"address of this machine, or 0\.0\.0\.0:{port} for all of them$"):
            vr.Mesh.attach(hosts=1, gpus=1, listen=listen, key_file=str(tmp_path / "mesh.key"), preload=[], echo=False)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        listen = f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(OSError, match=rf"^cannot listen on {listen} for agents: Address already in use.*; another "
                                          "process listens there: pick another port$"):
            vr.Mesh.attach(hosts=1, gpus=1, listen=listen, key_file=str(tmp_path / "mesh.key"), preload=[], echo=False)


def test_an_agent_reading_the_key_file_while_the_controller_writes_it_never_finds_it_empty(tmp_path, monkeypatch):
    """The file was created empty, then written: an agent started beside the controller (on a
    shared filesystem, or this suite's silent agent) read '' and failed ('is 0 bytes')."""
    from viceroy.runtime import mesh_key

    path = str(tmp_path / "mesh.key")
    read_meanwhile: list[object] = []
    real_fdopen = os.fdopen

    def fdopen(fd: int, *args: Any, **kw: Any) -> Any:
        f = real_fdopen(fd, *args, **kw)
        write = f.write

        def write_then_look(text: str) -> int:  # an agent reading the file as the key goes in
            if os.path.exists(path):
                try:
                    read_meanwhile.append(mesh_key.read_key(path))
                except ValueError as e:
                    read_meanwhile.append(e)
            return write(text)

        f.write = write_then_look
        return f

    monkeypatch.setattr(os, "fdopen", fdopen)
    key, _ = mesh_key.key_for_controller(path, 7777)
    monkeypatch.undo()
    assert read_meanwhile == [] and mesh_key.read_key(path) == key
    assert os.listdir(tmp_path) == ["mesh.key"] and stat.S_IMODE(os.stat(path).st_mode) == 0o600
