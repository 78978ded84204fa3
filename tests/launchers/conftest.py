"""A real OpenSSH server on loopback, started by the tests (`.ci/run` installs openssh-server)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import wait_until

SSHD = "/usr/sbin/sshd"


@dataclass
class Sshd:
    port: int
    identity: str
    pid: int


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[Sshd]:
    if not os.path.exists(SSHD) or shutil.which("ssh") is None:
        pytest.skip("openssh-server is not installed here (apt-get install openssh-server; .ci/run does)")
    if os.geteuid() != 0:
        pytest.skip("the test sshd logs in as root")
    host_key, client_key = tmp_path / "host_key", tmp_path / "client_key"
    for key in (host_key, client_key):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    (tmp_path / "authorized_keys").write_text((tmp_path / "client_key.pub").read_text())
    os.makedirs("/run/sshd", exist_ok=True)
    port = _free_port()
    config = tmp_path / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {host_key}\n"
        f"AuthorizedKeysFile {tmp_path / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\nUsePAM no\nStrictModes no\nPidFile none\nLogLevel ERROR\n"
        "AcceptEnv none\n"
    )
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stderr=subprocess.PIPE)
    try:
        wait_until(lambda: _accepts(port) or proc.poll() is not None, 10, "sshd to listen")
        if proc.poll() is not None:
            raise RuntimeError(f"sshd did not start: {proc.stderr.read().decode() if proc.stderr else ''}")
        yield Sshd(port, str(client_key), proc.pid)
    finally:
        proc.kill()
        proc.wait()
