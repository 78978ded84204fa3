"""The ssh launcher: one agent per host, started with `ssh HOST python -m viceroy.runtime.agent`.

The mesh key travels on the ssh session's stdin, never on a command line; the same stdin is
the agent's lifeline, so when the controller dies the remote agent sees EOF and takes its
ranks down. A frozen agent reads no EOF: when its host is given up, it is ended there over a
fresh ssh, found by the tag of its launch (see remains). Ranks on every host connect back to
the controller's address, so bind it to an interface the hosts can reach (`interface=`;
loopback by default).

    hosts.txt:   node1                   # one host per line
                 node2 python=/opt/venv/bin/python

Extra ssh options for every host can come from $VICEROY_SSH_OPTIONS (e.g. "-F ~/.ssh/cluster").
"""

from __future__ import annotations

import functools
import os
import shlex
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from viceroy.runtime import remains, rsync
from viceroy.runtime.arguments import check_argv, check_python
from viceroy.runtime.launcher import (
    AgentProcess,
    ChildAgent,
    HostPlan,
    Launcher,
    plan_by_hosts,
    start_child_agent,
    users_master_addr,
    with_master_addr,
)
from viceroy.runtime.rsync import Synced
from viceroy.runtime.ssh_hosts import SshHost, address_problem, host_list, read_hostfile

__all__ = ["SshHost", "SshLauncher", "Synced", "address_problem", "read_hostfile"]

# sshd drops connections beyond MaxStartups (default 10:30:100) that are still logging in: many
# agents through one sshd see "kex_exchange_identification: Connection reset by peer" (or
# "read: Connection reset by peer") before any login. Such a refusal is tried again, later.
_REFUSED_AT_START = ("kex_exchange_identification", "Connection reset by peer", "Connection closed by remote host")
SSH_START_TRIES = 8
# What ssh says (and exits 255) when it ran nothing on the host: it never connected, or never
# logged in. Such a launch left nothing there to end.
_NEVER_LOGGED_IN = ("ssh: connect to host ", "ssh: Could not resolve hostname", ": Permission denied (",
                    "Host key verification failed", "kex_exchange_identification:", "Bad port '")


class SshAgent(AgentProcess):
    """One host's agent over ssh, whose ssh is started again (after a random, growing pause)
    when sshd turned the connection away before the login (MaxStartups)."""

    def __init__(self, spawn: Callable[[], ChildAgent], end: Callable[[float], str | None]) -> None:
        self._spawn = spawn
        self._end = end
        self._lock = threading.Lock()
        self._killed = False
        self._never_in = False  # its ssh exited saying it never logged in (see end_remains)
        self._hello = False  # the agent reached the controller: it ran
        self.tries = 1
        self.current = spawn()
        self.host = self.current.host
        self.label = self.current.label

    def wait(self, timeout: float | None = None) -> int | None:
        code = self._wait(timeout)
        if self.tries == 1 and not self._never_in:  # (a retry may follow a reset session)
            # 126, 127: the host's shell could not run its Python (not executable, not there).
            # Read at the first wait that sees the exit: the log goes with `kill`, and a later
            # wait (the shutdown's) must not read its absence as a login.
            self._never_in = code in (126, 127) or (
                code == 255 and any(w in self.current.log_tail(10) for w in _NEVER_LOGGED_IN))
        return code

    def _wait(self, timeout: float | None) -> int | None:
        import random
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            code = self.current.wait(left)
            if code is None or code == 0 or self.tries >= SSH_START_TRIES:
                return code
            # A session that ran and was then cut ("client_loop: send disconnect: Connection reset
            # by peer") is a lost host, not a refusal: started again, its ranks would come back
            # empty while the controller took them for the ones it had.
            if self._hello or not any(w in self.current.log_tail(5) for w in _REFUSED_AT_START):
                return code
            time.sleep(min(0.2 * 2 ** self.tries, 4.0) * random.uniform(0.5, 1.5))
            with self._lock:
                if self._killed:
                    return code
                self.current.kill()
                self.tries += 1
                self.current = self._spawn()

    def said_hello(self) -> None:
        self._hello = True

    def kill(self) -> None:
        with self._lock:
            self._killed = True
            self.current.kill()

    def end_remains(self, timeout: float) -> str | None:
        if self._never_in:  # nothing ran there
            return None
        return self._end(timeout)  # over a fresh ssh: a frozen agent outlives its ssh client

    def log_tail(self, n: int = 40) -> str:
        return self.current.log_tail(n)

    def advice(self, last_words: str) -> str:
        return self.current.advice(last_words)

    def describe_exit(self, code: int | None) -> str:
        return self.current.describe_exit(code)


@dataclass
class SshLauncher(Launcher):
    """Agents over ssh (OpenSSH client; keys or an agent, never a password prompt)."""

    hosts: Sequence[SshHost | str]
    python: str = sys.executable
    port: int | None = None
    identity: str | None = None
    options: Sequence[str] = field(default_factory=tuple)
    name = "ssh"
    same_host = False

    def __post_init__(self) -> None:
        self.hosts = host_list(self.hosts)  # checked before anything starts
        self._master: str | None = None
        self._read: dict[str, Any] | None = None  # `ssh -G` per host, while the first start reads them
        check_python(self.python, "the hosts'")
        if self.port is not None and (isinstance(self.port, bool) or not isinstance(self.port, int)
                                      or not 0 < self.port < 65536):
            raise ValueError(f"port={self.port!r}: give sshd's port number (1-65535), or None for ssh's own (22, "
                             "or ~/.ssh/config's)")
        if self.identity is not None and (not isinstance(self.identity, str | os.PathLike) or not str(self.identity)):
            raise TypeError(f"identity={self.identity!r}: give the path of the private key file (ssh -i KEYFILE)")
        if self.identity is not None:
            self.identity = os.fspath(self.identity)
        self.options = check_argv(self.options, "ssh_options", "ssh", "-o ProxyJump=gateway")

    def plan(self, dims: dict[str, int]) -> list[HostPlan]:
        names = list(dims)
        if not names or names[0] != "hosts":
            raise ValueError(f"an ssh mesh's first dim is 'hosts', e.g. hosts={len(self.hosts)}, gpus=8; got {dims}")
        if dims["hosts"] != len(self.hosts):
            raise ValueError(f"hosts={dims['hosts']} but {len(self.hosts)} host(s) were given: {self.addresses()}")
        return plan_by_hosts(dims)

    def addresses(self) -> list[str]:
        return [h.address for h in self.hosts]  # type: ignore[union-attr]

    def ssh_base(self) -> list[str]:
        """ssh and its options, without a host: what every connection to the hosts uses. ssh
        keeps the first value it is given for an option, so the user's options come before our
        defaults (a longer ConnectTimeout is theirs to choose), but never before BatchMode: a
        password prompt would hang a kernel that has no terminal."""
        argv = ["ssh", "-o", "BatchMode=yes"]
        if self.port is not None:
            argv += ["-p", str(self.port)]
        if self.identity is not None:
            argv += ["-i", self.identity]
        return [*argv, *shlex.split(os.environ.get("VICEROY_SSH_OPTIONS", "")), *self.options,
                "-o", "ConnectTimeout=10", "-o", "ServerAliveInterval=1", "-o", "ServerAliveCountMax=3"]

    def remote_python(self, host: SshHost) -> str:
        """The host's Python as its shell reads it (~/: the remote home, which quotes would hide)."""
        python = host.python or self.python
        return f'"$HOME"/{shlex.quote(python[2:])}' if python.startswith("~/") else shlex.quote(python)

    def ssh_argv(self, host: SshHost, nonce: str | None = None) -> list[str]:
        """ssh running the agent on `host`, tagged with `nonce` (see remains) when given."""
        tag = f"export {remains.TAG}={nonce}; " if nonce else ""
        return [*self.ssh_base(), host.address, f"{tag}exec {self.remote_python(host)} -m viceroy.runtime.agent"]

    def rsync_argv(self, host: SshHost, src: str, dest: str, dry_run: bool = False, envs: tuple[str, ...] = ()) -> list[str]:
        """rsync over the same ssh as the agents' (see `rsync.rsync_argv`)."""
        return rsync.rsync_argv(self.ssh_base(), host.address, src, dest, dry_run, envs)

    def sync(self, src: str, dest: str | None = None, dry_run: bool = False, lost: frozenset[int] = frozenset()) -> list[Synced]:
        """Copy the directory `src` to every host (see `rsync.sync`)."""
        return rsync.sync(self, src, dest, dry_run, lost)

    def _ssh_g(self, host: SshHost) -> Any:
        """``ssh -G HOST`` (ssh's configuration for `host`, read without connecting), or None
        when ssh could not run. Run once per host while the first start reads them."""
        import subprocess

        if self._read is not None and host.address in self._read:
            return self._read[host.address]
        try:
            proc = subprocess.run([*self.ssh_base(), "-G", host.address], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            proc = None
        if self._read is not None:
            self._read[host.address] = proc
        return proc

    def _ssh_setting(self, host: SshHost, key: str) -> str | None:
        """What ssh's configuration (options, $VICEROY_SSH_OPTIONS, ~/.ssh/config) sets `key`
        to for `host` (``ssh -G``), or None when ssh cannot say."""
        proc = self._ssh_g(host)
        out = proc.stdout if proc is not None else ""
        values = [ln.split(None, 1)[1] for ln in out.splitlines() if ln.startswith(f"{key} ") and " " in ln]
        return values[0] if values else None

    def check_options(self) -> None:
        """Refuse, before any connection, options ssh itself refuses (``ssh -G`` reads them and
        connects nowhere): the agents' ssh would fail alike on every host."""
        import shutil

        first = self.hosts[0]
        assert isinstance(first, SshHost)
        proc = self._ssh_g(first)
        if proc is None:
            if shutil.which(self.ssh_base()[0]) is None:
                raise FileNotFoundError("ssh is not installed here: the ssh launcher needs OpenSSH's client")
            return  # the launch will say what is wrong
        if proc.returncode != 0:
            words = "; ".join(ln.strip() for ln in proc.stderr.splitlines() if ln.strip()) or f"exit code {proc.returncode}"
            extra = os.environ.get("VICEROY_SSH_OPTIONS", "")
            where = f"ssh_options={list(self.options)!r}" + (f", $VICEROY_SSH_OPTIONS={extra!r}" if extra.strip() else "")
            raise ValueError(f"ssh refuses its options ({words}): check {where}, port and identity "
                             "(in %mesh up: --ssh-options, --ssh-port, --identity)")

    def real_hostname(self, host: SshHost) -> str:
        """What `host` names once ssh's configuration has had its say (aliases, ``user@``)."""
        return self._ssh_setting(host, "hostname") or host.address.rpartition("@")[2]

    def start(self, host: HostPlan, config: dict[str, Any]) -> AgentProcess:
        target = self.hosts[host.index]
        assert isinstance(target, SshHost)
        if self._master is None:  # torch.distributed's rendezvous is on rank 0, on host 0
            self._read = {}  # each host's `ssh -G`, read once for the three
            try:
                self.check_options()
                self._master = "" if users_master_addr(config) else self._rendezvous_host(config["controller_in"])
                self._check_reachable(config["controller_in"])
            finally:
                self._read = None  # later (advice on a failure) ssh's configuration is read afresh
        config = with_master_addr(config, self._master)
        nonce = remains.new_nonce()  # tags this launch's processes on the host
        label = f"host {host.index} ({target.address}, via ssh)"

        def spawn() -> ChildAgent:
            agent = start_child_agent(self.ssh_argv(target, nonce), config, host.index)
            agent.label = label
            agent.advise = functools.partial(self.advice, target, config["controller_in"])
            return agent

        ssh = [*self.ssh_base(), target.address]
        return SshAgent(spawn, functools.partial(remains.end_over_ssh, ssh, self.remote_python(target), nonce, label))

    def _rendezvous_host(self, controller: str) -> str:
        """MASTER_ADDR for every host: host 0's name. Host 0 named by a loopback name
        (``localhost``) is this machine, and from the other hosts that name is themselves: they
        get the address of this machine the controller listens on, which they reach."""
        first = self.hosts[0]
        assert isinstance(first, SshHost)
        name = self.real_hostname(first)
        if not _resolves_to_loopback(name):
            return name
        others = [(h, t) for h, t in enumerate(self.hosts) if h and not _resolves_to_loopback(self.real_hostname(t))]  # type: ignore[arg-type]
        if not others:
            return name  # every host is this machine
        where = controller.partition("://")[2].rpartition(":")[0].strip("[]")
        if where and not _is_loopback(where) and where not in ("0.0.0.0", "::", "*"):
            return where
        h, target = others[0]
        raise ValueError(
            f"host 0 ({first.address}) is this machine by a loopback name, which host {h} ({target.address}) "  # type: ignore[union-attr]
            f"would read as itself: torch.distributed's rendezvous (MASTER_ADDR) would point there. Name host 0 "
            "by an address the other hosts reach, or give the controller one (interface=ADDR, --listen ADDR)"
        )

    def _check_reachable(self, controller: str) -> None:
        """A controller on loopback cannot be reached from another machine: say so before
        starting anything (the agent would wait out its 10 s of silence, then give up)."""
        where = controller.partition("://")[2].rpartition(":")[0].strip("[]")
        if not _is_loopback(where):
            return
        for h, target in enumerate(self.hosts):
            assert isinstance(target, SshHost)
            if _is_elsewhere(self.real_hostname(target)):
                raise ValueError(
                    f"host {h} ({target.address}) is another machine, but the controller listens on {where} "
                    "(loopback), which it cannot reach: give an address of this machine that the hosts can "
                    "reach, Mesh.ssh(..., interface=ADDR) or %mesh up ... --listen ADDR"
                )

    def advice(self, target: SshHost, controller: str, words: str) -> str:
        """What to do about an agent over ssh that ended saying `words`."""
        addr, python = target.address, target.python or self.python
        ssh = f"ssh -p {self.port} {addr}" if self.port is not None else f"ssh {addr}"
        if f"{python}: Permission denied" in words or "cannot execute" in words:
            return (f"{python} on {addr} cannot be run there (not an executable file): name that host's Python "
                    "with python=PATH on its hostfile line, or Mesh.ssh(..., python=PATH)")
        if "Permission denied" in words:
            return (f"{addr} refused the login and the ssh launcher never types a password (BatchMode): make "
                    f"`{ssh} true` work without one (ssh-copy-id {addr}, ssh-add), or give it a key: "
                    "identity=KEYFILE in Mesh.ssh, --identity KEYFILE in %mesh up")
        if "Host key verification failed" in words or "HOST IDENTIFICATION HAS CHANGED" in words:
            return (f"{addr}'s host key is not in known_hosts, or has changed: check it and accept it with "
                    f"`{ssh}` once (after `ssh-keygen -R {addr}` if it changed)")
        if "Could not resolve hostname" in words:
            return f"{addr} is not a host name this machine resolves: check its hostfile line or ~/.ssh/config"
        if any(w in words for w in _REFUSED_AT_START):
            return (f"{addr}'s sshd kept turning the connection away before the login (tried {SSH_START_TRIES} "
                    "times): too many connections at once for its MaxStartups (default 10:30:100, i.e. 10). "
                    "Raise MaxStartups in that host's sshd_config (e.g. MaxStartups 100:30:200), or put "
                    "fewer hosts behind one sshd")
        if any(w in words for w in ("Connection refused", "No route to host", "timed out", "Network is unreachable")):
            port = self._ssh_setting(target, "port")  # from options, $VICEROY_SSH_OPTIONS or ~/.ssh/config
            on = f"port {port}" if port else "the port ssh uses for it"
            return f"{addr} did not take the ssh connection: is it up, and is sshd listening on {on}?"
        if f"{python}: No such file or directory" in words or f"{python}: not found" in words:
            return (f"there is no {python} on {addr}: name that host's Python with python=PATH on its hostfile "
                    "line, or Mesh.ssh(..., python=PATH)")
        if "No module named" in words:
            return (f"{python} on {addr} lacks viceroy or a module it needs: pip install viceroy-kernel there, "
                    "or name a Python that has it (python=PATH)")
        if "nothing from the controller" in words:
            return (f"{addr} could not reach the controller at {controller}: listen on an address of this machine "
                    "that it can reach (interface=ADDR, --listen ADDR), and check that no firewall blocks it")
        return ""


def _is_loopback(name: str) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return name == "localhost"


def _resolves_to_loopback(name: str) -> bool:
    """Whether `name` is, or resolves only to, loopback addresses (localhost, 127.0.1.1)."""
    import ipaddress
    import socket

    if _is_loopback(name):
        return True
    try:
        addrs = {str(i[4][0]) for i in socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)}
    except (OSError, UnicodeError):
        return False
    return bool(addrs) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addrs)


def _is_elsewhere(name: str) -> bool:
    """Whether `name` resolves to no address of this machine (False when it does not resolve
    here at all: ssh may know better, through a proxy)."""
    import socket

    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return False
    for family, _, _, _, sockaddr in infos:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.bind((sockaddr[0], 0))  # only an address of this machine can be bound
            return False
        except OSError:
            continue
    return True
