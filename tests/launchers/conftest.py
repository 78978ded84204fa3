"""Real components the launcher tests start themselves: an OpenSSH server on loopback (`make test`
installs openssh-server), and "hosts" as network namespaces, each with an sshd of its own."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import wait_until
from tests.launchers.netns import Hosts, skip_reason
from tests.launchers.slurm_cluster import SlurmCluster
from tests.launchers.slurm_cluster import skip_reason as slurm_skip_reason

SSHD = "/usr/sbin/sshd"
SSH_OPTS = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR"]


@dataclass
class Sshd:
    port: int
    identity: str
    pid: int


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _accepts(address: str, port: int, prefix: list[str]) -> bool:
    probe = f"import socket; socket.create_connection(({address!r}, {port}), timeout=0.2)"
    if not prefix:
        try:
            with socket.create_connection((address, port), timeout=0.2):
                return True
        except OSError:
            return False
    return subprocess.run([*prefix, "python3", "-c", probe], capture_output=True).returncode == 0


def _need_sshd() -> None:
    if not os.path.exists(SSHD) or shutil.which("ssh") is None:
        pytest.skip("openssh-server is not installed here (apt-get install openssh-server; make test does, as root)")
    if os.geteuid() != 0:
        pytest.skip("the test sshd logs in as root")


def _keys(tmp_path: Path) -> tuple[Path, Path]:
    host_key, client_key = tmp_path / "host_key", tmp_path / "client_key"
    for key in (host_key, client_key):
        if not key.exists():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    (tmp_path / "authorized_keys").write_text((tmp_path / "client_key.pub").read_text())
    return host_key, client_key


def start_sshd(tmp_path: Path, address: str, port: int, prefix: list[str] | None = None,
               extra: str = "") -> subprocess.Popen[bytes]:
    """`sshd -D` listening on address:port (inside a namespace when `prefix` is `ip netns exec NS`);
    `extra` is more sshd_config lines."""
    host_key, _ = _keys(tmp_path)
    os.makedirs("/run/sshd", exist_ok=True)
    config = tmp_path / f"sshd_config_{address}"
    config.write_text(
        f"Port {port}\nListenAddress {address}\nHostKey {host_key}\n"
        f"AuthorizedKeysFile {tmp_path / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\nUsePAM no\nStrictModes no\nPidFile none\nLogLevel ERROR\n"
        # Logins get the session's temp directory, as local agents do: what an agent started
        # over ssh leaves in it is found by the leak checks, and no other test run sees it.
        f"AcceptEnv none\nSetEnv TMPDIR={tempfile.gettempdir()}\n" + extra
    )
    proc = subprocess.Popen([*(prefix or []), SSHD, "-D", "-e", "-f", str(config)], stderr=subprocess.PIPE)
    try:
        wait_until(lambda: _accepts(address, port, prefix or []) or proc.poll() is not None, 10, f"sshd on {address}")
        if proc.poll() is not None:
            raise RuntimeError(f"sshd did not start: {proc.stderr.read().decode() if proc.stderr else ''}")
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[Sshd]:
    _need_sshd()
    port = _free_port()
    proc = start_sshd(tmp_path, "127.0.0.1", port)
    try:
        yield Sshd(port, str(tmp_path / "client_key"), proc.pid)
    finally:
        proc.kill()
        proc.wait()


@dataclass
class NsHosts:
    """n namespaces, each an ssh host at `addresses[i]:port` (the same port on each)."""

    net: Hosts
    port: int
    identity: str

    @property
    def addresses(self) -> list[str]:
        return [self.net.address(i) for i in range(1, self.net.n + 1)]


@pytest.fixture
def ns_hosts(tmp_path: Path) -> Iterator[NsHosts]:
    """Two hosts as network namespaces with an sshd each; the controller listens on
    netns.CONTROLLER_ADDR. Skips (saying why) without root or iproute2."""
    why = skip_reason()
    if why:
        pytest.skip(why)
    _need_sshd()
    net = Hosts(2).open()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        port = 2222
        for i in (1, 2):
            procs.append(start_sshd(tmp_path, net.address(i), port, net.exec_argv(i)))
        yield NsHosts(net, port, str(tmp_path / "client_key"))
    finally:
        for p in procs:
            p.kill()
            p.wait()
        net.close()


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A one-node Slurm cluster (munged, slurmctld, slurmd) for this module; SLURM_CONF points
    at it while it runs. Skips (saying why) where Slurm is not installed or not root."""
    why = slurm_skip_reason()
    if why:
        pytest.skip(why)
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm")).start()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SLURM_CONF", str(cluster.conf))
        for var in [v for v in os.environ if v.startswith("SLURM_") and v != "SLURM_CONF"]:
            mp.delenv(var)  # tests that want an allocation's variables set them
        try:
            yield cluster
        finally:
            cluster.stop()


@pytest.fixture
def nothing_may_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails the test if a process is started (ssh, ssh -G, salloc, an agent) or a controller
    made: for arguments that must be refused before anything starts."""
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"started {args[0] if args else kwargs} before refusing the arguments")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setattr("viceroy.runtime.starting.Controller", refuse)
