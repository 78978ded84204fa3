"""Launchers start one host agent per host. `LocalLauncher` runs them on this machine; ssh and
Slurm launchers implement the same two methods."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import IO, Any

from viceroy.runtime import remains
from viceroy.runtime.collectives.backend import check_backend_env
from viceroy.runtime.procs import end_descendants


@dataclass(frozen=True)
class HostPlan:
    """Which ranks one host runs: ``ranks`` is a list of ``{"rank", "local_rank", "coords"}``."""

    index: int
    ranks: list[dict[str, Any]]

    def ranks_ids(self) -> list[int]:
        return [rc["rank"] for rc in self.ranks]


class AgentProcess(ABC):
    """The controller's handle on one running agent."""

    host: int
    label: str

    @abstractmethod
    def wait(self, timeout: float | None = None) -> int | None:
        """Block until the agent exits (its exit code) or the timeout passes (None)."""

    @abstractmethod
    def kill(self) -> None: ...

    @abstractmethod
    def log_tail(self, n: int = 40) -> str: ...

    def advice(self, last_words: str) -> str:
        """What the user can do about an agent that ended with `last_words` ("" if nothing
        to say); launchers that know their tool's failures say more."""
        return ""

    def said_hello(self) -> None:
        """The agent reached the controller (IO thread): it runs where it was started. Nothing
        to do for most launchers."""
        return None

    def end_remains(self, timeout: float) -> str | None:
        """After `kill`: make sure nothing of this launch is left where the agent ran (an agent
        `kill` could not reach: frozen on another host, its ranks with it), within `timeout` s.
        None when nothing is left (or there is nothing more to do); else why not, and what the
        user can do. Blocks: never call it on the controller's event loop."""
        return None

    def describe_exit(self, code: int | None) -> str:
        """How `wait`'s result reads in an error message."""
        if code is None:
            return "no exit code"
        if code < 0:
            try:
                return signal.Signals(-code).name
            except ValueError:
                return f"signal {-code}"
        return f"exit code {code}"


class Launcher(ABC):
    """Where agents run. `plan` splits the mesh's ranks over hosts; `start` launches one agent
    and hands it its configuration, key included, over a private channel (never argv)."""

    name: str = "?"
    same_host: bool = False  # agents run on the controller's machine: use Unix sockets
    mesh_key: bytes | None = None  # a key of the user's (attach mode); else a fresh one per mesh

    @abstractmethod
    def plan(self, dims: dict[str, int]) -> list[HostPlan]: ...

    @abstractmethod
    def start(self, host: HostPlan, config: dict[str, Any]) -> AgentProcess: ...

    def close(self) -> None:
        """The mesh is shut down (a launcher that listens stops listening)."""
        return None


def check_env(env: Mapping[str, Any] | None) -> None:
    """Refuse, before anything starts, what no process environment can hold."""
    if env is not None and not isinstance(env, Mapping):
        raise TypeError(f"env={env!r}: give a dict of variable names and values, e.g. env={{'NCCL_DEBUG': 'INFO'}}")
    for name, value in (env or {}).items():
        if not isinstance(name, str) or not name or "=" in name or "\0" in name:
            raise ValueError(f"env: {name!r} is not an environment variable name (no '=', not empty)")
        if not isinstance(value, str):  # None or True would be the ranks' "None", "True"
            raise TypeError(f"env: the value of {name} is {value!r}, not a string: give the text the variable "
                            f"holds, e.g. env={{{name!r}: {str(value)!r}}}")
        if "\0" in value:
            raise ValueError(f"env: the value of {name} holds a NUL character")
    check_backend_env(env)


def users_master_addr(config: dict[str, Any]) -> bool:
    """Whether the user gave MASTER_ADDR in `env` (as with MASTER_PORT, theirs wins). The
    controller's default (`rendezvous_env`) is its own interface, which `controller_in` names:
    a different value is the user's."""
    interface = config.get("controller_in", "").partition("://")[2].rpartition(":")[0].strip("[]")
    return config.get("env", {}).get("MASTER_ADDR") not in (None, interface)


def with_master_addr(config: dict[str, Any], host0: str) -> dict[str, Any]:
    """`config` with MASTER_ADDR set to `host0` for every host, unless the user gave one."""
    if users_master_addr(config):
        return config
    return {**config, "env": {**config.get("env", {}), "MASTER_ADDR": host0}}


def rendezvous_env(interface: str) -> dict[str, str]:
    """MASTER_ADDR/PORT for torch.distributed and friends: rank 0's host and a port that is
    free here, or $VICEROY_MASTER_PORT. (Launchers for many hosts override MASTER_ADDR with
    host 0's address; a port free here may be taken there, hence the variable.)"""
    import socket

    port = os.environ.get("VICEROY_MASTER_PORT", "")
    if port and (not port.isdigit() or not 0 < int(port) < 65536):
        raise ValueError(f"VICEROY_MASTER_PORT={port!r} is not a port number (1-65535)")
    host, _, port_part = interface.rpartition(":")
    if host and ":" not in host and port_part.isdigit():  # (an IPv6 address has colons of its own)
        raise ValueError(f"interface={interface!r}: give the address alone, {host!r}; the controller picks its "
                         "own ports (and $VICEROY_MASTER_PORT, if set, is the rendezvous')")
    with socket.socket() as s:  # (also checks that the controller can listen there at all)
        try:
            s.bind((interface, 0))
        except OSError as e:
            why = getattr(e, "strerror", None) or str(e)
            raise ValueError(
                f"interface={interface!r}: the controller cannot listen there ({why}); it is not an "
                "address of this machine. Give one that every host can reach, or 127.0.0.1 (the "
                "default) when the mesh is on this machine alone"
            ) from None
        port = port or str(s.getsockname()[1])
    return {"MASTER_ADDR": interface, "MASTER_PORT": port}


def plan_by_hosts(dims: dict[str, int]) -> list[HostPlan]:
    """One host per index of a leading ``hosts`` dim, else one host for the whole mesh. Ranks are
    row-major, so each host holds a contiguous block."""
    names = list(dims)
    n = 1
    for v in dims.values():
        n *= v
    n_hosts = dims["hosts"] if names and names[0] == "hosts" else 1
    per_host = n // n_hosts
    plans = []
    for h in range(n_hosts):
        ranks = []
        for local in range(per_host):
            rank = h * per_host + local
            ranks.append({"rank": rank, "local_rank": local, "coords": _coords(rank, dims)})
        plans.append(HostPlan(h, ranks))
    return plans


def _coords(rank: int, dims: dict[str, int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for name in reversed(list(dims)):
        rank, out[name] = divmod(rank, dims[name])
    return dict(reversed(list(out.items())))


class ChildAgent(AgentProcess):
    """An agent reached through a child process of ours (the agent itself, or the ssh/srun
    that runs it): its stdin carries the configuration, then stays open as the lifeline."""

    def __init__(self, host: int, proc: subprocess.Popen[bytes], log: IO[bytes], log_path: str, label: str) -> None:
        self.host = host
        self.label = label
        self.advise: Callable[[str], str] | None = None  # the launcher's reading of the last words
        self.is_agent = False  # the child is the agent itself (not an ssh or srun): see kill
        self.tag = ""  # its VICEROY_AGENT_ID, when it runs on this machine (see end_remains)
        self.proc = proc
        self._log = log
        self._log_path = log_path

    def end_remains(self, timeout: float) -> str | None:
        """An agent of this machine killed outright left its ranks' daemons to init: they carry
        its tag (see remains)."""
        if self.tag:
            remains.end_launch(self.tag)
            remains.remove_rundirs(self.tag)
        return None

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """Kill the child if it still runs, with its process group (an agent and its fork
        server); an agent of this machine loses every process below it first. (An agent that
        stopped by itself had ended all of that; the ranks of one killed lead groups of their
        own, which they end when their lifeline breaks.)"""
        if self.proc.poll() is None:
            if self.is_agent:
                # A frozen agent, or one slow to stop: held still, so that it restarts nothing,
                # while what is below it goes, daemons of its ranks included (it is a subreaper:
                # they are below it until it dies, and beyond anyone's reach after).
                with contextlib.suppress(OSError):
                    os.kill(self.proc.pid, signal.SIGSTOP)
                end_descendants(root=self.proc.pid)
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # its own session's group
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
        self.proc.wait()
        if self.proc.stdin:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        self._log.close()
        try:
            os.unlink(self._log_path)
        except OSError:
            pass

    def advice(self, last_words: str) -> str:
        return self.advise(last_words) if self.advise else ""

    def log_tail(self, n: int = 40) -> str:
        try:
            with open(self._log_path, "rb") as f:
                return b"\n".join(f.read().splitlines()[-n:]).decode(errors="replace")
        except OSError:
            return ""


def agent_env() -> dict[str, str]:
    """The agent must import the same viceroy as this process, installed or not."""
    import viceroy

    root = os.path.dirname(os.path.dirname(os.path.abspath(viceroy.__file__)))
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else "")}


class LocalLauncher(Launcher):
    """Agents as child processes of this one, each in its own session (so the kernel's SIGINT to
    its process group does not reach them). Their stdin is the lifeline: when this process dies,
    by any signal, the pipe closes and the agent takes its ranks down."""

    name = "local"
    same_host = True

    def plan(self, dims: dict[str, int]) -> list[HostPlan]:
        return plan_by_hosts(dims)

    def start(self, host: HostPlan, config: dict[str, Any]) -> AgentProcess:
        tag = remains.new_nonce()
        agent = start_child_agent(
            [sys.executable, "-m", "viceroy.runtime.agent"], config, host.index, cwd=config.get("cwd"),
            env={**agent_env(), remains.TAG: tag},
        )
        agent.label = f"host {host.index} (local, pid {agent.proc.pid})"
        agent.is_agent, agent.tag = True, tag
        return agent


def start_child_agent(
    argv: list[str], config: dict[str, Any], host: int, cwd: str | None = None, env: dict[str, str] | None = None
) -> ChildAgent:
    """Run `argv` in its own session (the kernel's SIGINT must not reach it), hand it the
    configuration on stdin (never on the command line, where `ps` would show the key), and
    keep stdin open as its lifeline."""
    fd, log_path = tempfile.mkstemp(prefix=f"viceroy-agent{host}-", suffix=".log")
    log = os.fdopen(fd, "wb")
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=log, stderr=log, start_new_session=True, cwd=cwd or None, env=env
    )
    assert proc.stdin is not None
    try:
        proc.stdin.write((json.dumps(config) + "\n").encode())
        proc.stdin.flush()
    except BrokenPipeError:  # it exited before reading (ssh found no route): its exit says why
        pass
    return ChildAgent(host, proc, log, log_path, f"host {host} (pid {proc.pid})")
