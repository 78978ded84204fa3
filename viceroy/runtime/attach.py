"""Attach mode: agents started by anything (Kubernetes, torchrun, mpirun, a shell on each host)
connect to a controller that waits for them.

    controller:  Mesh.attach(hosts=2, gpus=8, listen="0.0.0.0:7777", key_file="mesh.key")
    each host:   viceroy agent --connect 10.0.0.1:7777 --key-file mesh.key   (or $VICEROY_MESH_KEY)

The controller listens on `listen` (loopback unless the user names another interface) with a
ZeroMQ ROUTER; an agent sends a signed "attach" request there, retrying until the controller is
up, and gets back its host's configuration: which ranks, and the ports of the mesh's own
sockets (on the address the agent used to reach it). The key never travels: both sides read it
from a 0600 file or an environment variable, and anything not signed with it is dropped unread.
An attached agent has no pipe from the controller: heartbeats are its lifeline, so when the
controller dies or the link stays cut it kills its ranks and exits.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import stat
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq

from viceroy.runtime.launcher import (
    AgentProcess,
    HostPlan,
    Launcher,
    plan_by_hosts,
    users_master_addr,
)
from viceroy.runtime.wire import BadMessage, Signer

KEY_ENV = "VICEROY_MESH_KEY"


# --- the key ---------------------------------------------------------------------------------


def read_key(path: str | None) -> bytes:
    """The mesh key from a 0600 file (hex), else from $VICEROY_MESH_KEY."""
    if path is None:
        text = os.environ.get(KEY_ENV)
        if not text:
            raise ValueError(f"no mesh key: pass --key-file FILE (a 0600 file) or set ${KEY_ENV}")
        where = f"${KEY_ENV}"
    else:
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            raise FileNotFoundError(
                f"no key file {path}: copy the mesh's key file from the controller's machine (Mesh.attach "
                f"writes it there, mode 0600) to {path} here, or set ${KEY_ENV} to its contents"
            ) from None
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(f"{path} is a directory; --key-file names the mesh's key file (e.g. mesh.key)")
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise PermissionError(
                f"{path} is readable by others (mode {stat.S_IMODE(mode):o}); the mesh key must be "
                f"private: chmod 600 {path}"
            )
        with open(path) as f:
            text = f.read()
        where = path
    try:
        key = bytes.fromhex(text.strip())
    except ValueError:
        raise ValueError(f"the mesh key in {where} is not hex (expected 64 hex digits)") from None
    if len(key) < 16:
        raise ValueError(f"the mesh key in {where} is {len(key)} bytes; use at least 16 (32 is the default)")
    return key


def key_for_controller(path: str | None, port: int) -> tuple[bytes, str | None]:
    """The key of an attach mesh: from `path` if it exists, else a fresh one written there
    (mode 0600); with no path, from $VICEROY_MESH_KEY, else ~/.viceroy/attach-PORT.key."""
    if path is None:
        if os.environ.get(KEY_ENV):
            return read_key(None), None
        folder = os.path.expanduser("~/.viceroy")
        os.makedirs(folder, mode=0o700, exist_ok=True)
        path = os.path.join(folder, f"attach-{port}.key")
    if os.path.exists(path):
        return read_key(path), path
    key = secrets.token_bytes(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileNotFoundError:
        raise FileNotFoundError(f"key_file={path!r}: there is no directory {os.path.dirname(path) or '.'} to create "
                                "it in (a missing key file is created, mode 0600)") from None
    with os.fdopen(fd, "w") as f:
        f.write(key.hex() + "\n")
    return key, path


def split_address(addr: str) -> tuple[str, int]:
    """``"tcp://10.0.0.1:7777"``, ``"10.0.0.1:7777"`` -> ("10.0.0.1", 7777)."""
    if not isinstance(addr, str):
        raise TypeError(f"expected HOST:PORT as a string (e.g. '127.0.0.1:7777'), got {addr!r}")
    host, _, port = addr.removeprefix("tcp://").rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"expected HOST:PORT (e.g. 127.0.0.1:7777), got {addr!r}")
    if not 0 < int(port) < 65536:  # zmq took 99999 and listened on another port
        raise ValueError(f"{int(port)} is not a port number (1-65535), in {addr!r}")
    return host.strip("[]"), int(port)


# --- the controller's side -------------------------------------------------------------------


class AttachedAgent(AgentProcess):
    """A host whose agent someone else starts: waiting until one attaches, then live until the
    controller gives it up (heartbeats) or it says goodbye."""

    def __init__(self, host: int, hint: str, on_kill: Callable[[AttachedAgent], None] | None = None) -> None:
        self.host = host
        self.label = f"host {host} (waiting for an agent to attach)"
        self._hint = hint
        self._gone = threading.Event()
        self._on_kill = on_kill
        self.attached_from: str | None = None
        self.attached_at: float | None = None  # time.monotonic() when an agent took this host's config
        self.ports = ""  # the mesh's other ports, which the agent must reach next

    def wait(self, timeout: float | None = None) -> int | None:
        return 0 if self._gone.wait(timeout) else None

    def kill(self) -> None:
        self._gone.set()  # it hears no more heartbeats and stops by itself
        if self._on_kill:
            self._on_kill(self)  # not waiting for an agent any more

    def log_tail(self, n: int = 40) -> str:
        return "" if self.attached_from else f"host {self.host}: no agent attached; {self._hint}"

    def describe_exit(self, code: int | None) -> str:
        return "it was given up"


class AttachLauncher(Launcher):
    """Waits on `listen` for agents; the first to ask gets the lowest free host (or the one
    it asks for with ``--host N``)."""

    name = "attach"
    same_host = False

    def __init__(self, listen: str = "127.0.0.1:7777", key_file: str | None = None) -> None:
        try:
            self.host_addr, self.port = split_address(listen)
        except (TypeError, ValueError) as e:
            raise type(e)(f"listen={listen!r}: {e}") from None
        self.mesh_key, self.key_file = key_for_controller(key_file, self.port)
        self._signer = Signer(self.mesh_key)
        self._pending: dict[int, tuple[dict[str, Any], AttachedAgent]] = {}
        self._given_up: set[int] = set()  # lost hosts not restarted yet: their new agents wait
        self._holder: dict[int, str] = {}  # host -> the agent that has it
        self._answered: dict[Any, list[Any]] = {}  # request nonce -> its answer (for the agent's retries)
        self._master: str | None = None  # host 0's address, as its agent reached us
        self._lock = threading.Lock()
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        try:
            self._sock.bind(f"tcp://{self.host_addr}:{self.port}")
        except zmq.ZMQError as e:
            self._sock.close()
            self._ctx.term()
            what = ("another process listens there: pick another port" if e.errno == zmq.EADDRINUSE else
                    f"give an IPv4 address of this machine, or 0.0.0.0:{self.port} for all of them")
            raise OSError(f"cannot listen on {listen} for agents: {e}; {what}") from None
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="viceroy-attach", daemon=True)
        self._thread.start()

    @property
    def interface(self) -> str:
        return self.host_addr

    def command(self) -> str:
        # on every interface: this machine's name (what other hosts can look up), not localhost
        where = socket.gethostname() if self.host_addr in ("0.0.0.0", "::", "*") else self.host_addr
        key = f"--key-file {self.key_file}" if self.key_file else f"${KEY_ENV} set to the key"
        return f"viceroy agent --connect {where}:{self.port} {key}"

    def plan(self, dims: dict[str, int]) -> list[HostPlan]:
        if list(dims)[:1] != ["hosts"]:
            raise ValueError(f"an attach mesh's first dim is 'hosts' (one per agent), e.g. hosts=2, gpus=8; got {dims}")
        return plan_by_hosts(dims)

    def start(self, host: HostPlan, config: dict[str, Any]) -> AgentProcess:
        agent = AttachedAgent(host.index, f"start one with `{self.command()}`", self._withdraw)
        with self._lock:
            self._pending[host.index] = (config, agent)
            self._given_up.discard(host.index)
            self._holder.pop(host.index, None)
        return agent

    def _withdraw(self, agent: AttachedAgent) -> None:
        """`agent`'s host was given up: an agent attaching now must not get its (old) config;
        it waits for `restart`."""
        with self._lock:
            if self._pending.get(agent.host, (None, None))[1] is agent:
                del self._pending[agent.host]
            if not self._closed:
                self._given_up.add(agent.host)

    def waiting(self) -> list[int]:
        with self._lock:
            return sorted(self._pending)

    def close(self) -> None:
        self._closed = True
        self._thread.join(timeout=2)

    def _serve(self) -> None:
        try:
            while not self._closed:
                if not self._sock.poll(200):
                    continue
                ident, *frames = self._sock.recv_multipart(copy=False)
                try:
                    header, _, _ = self._signer.unpack(frames)
                except BadMessage:
                    continue  # not signed with the mesh key: dropped unread
                if header.get("op") == "attach":
                    try:
                        peer = str(frames[0].get("Peer-Address"))  # where the agent came from
                    except zmq.ZMQError:
                        peer = None
                    self._sock.send_multipart([ident, *self._answer(header, peer)])
        finally:
            self._sock.close()
            self._ctx.term()

    def _answer(self, req: dict[str, Any], peer: str | None) -> list[Any]:
        # One request (and the agent's retries of it) by its nonce: hostname and pid do not tell
        # agents apart (containers are all pid 1, hostNetwork pods share a name, a restarted
        # pod comes back with both the same).
        who = req.get("nonce") or (req.get("hostname"), req.get("pid"))
        with self._lock:
            if who in self._answered:  # a retry whose first answer is still on its way
                return self._answered[who]
            want = req.get("want")
            lost = sorted(self._given_up) if want is None else [want] if want in self._given_up else []
            no_host = not self._pending if want is None else want not in self._pending
            if no_host and lost:
                why = (f"host {', '.join(map(str, lost))} was lost and waits for mesh.restart(failed_only=True) "
                       "on the controller")
                return self._signer.pack({"op": "wait", "why": why})
            if want is not None and want not in self._pending:
                has = f" (it has one: {self._holder[want]})" if want in self._holder else ""
                why = (f"host {want} is not waiting for an agent{has}; waiting: "
                       f"{sorted(self._pending) or 'none'} (leave out --host to take any)")
                return self._signer.pack({"op": "refused", "why": why})
            if not self._pending:
                return self._signer.pack({"op": "refused", "why": "every host of this mesh has an agent already"})
            h = want if want is not None else min(self._pending)
            if h != 0 and 0 in self._pending and self._master is None:
                # torch.distributed's rendezvous is on rank 0: other hosts learn its address
                # from host 0's agent, so they wait for it (they ask again)
                return self._signer.pack({"op": "wait", "why": "host 0's agent attaches first (its address is the "
                                          "rendezvous); start it"})
            config, agent = self._pending.pop(h)
            if h == 0 and peer:
                self._master = peer
            self._holder[h] = f"{req.get('hostname', '?')}, pid {req.get('pid', '?')}"
        agent.attached_from = self._holder[h]
        agent.ports = " and ".join(config[k].rsplit(":", 1)[1] for k in ("controller_in", "controller_out"))
        agent.attached_at = time.monotonic()
        agent.label = f"host {h} ({agent.attached_from}, attached)"
        cfg = {k: v for k, v in config.items() if k != "key"}  # the agent has the key already
        if users_master_addr(cfg):
            pass  # the user's MASTER_ADDR wins, as with the other launchers
        elif self._master and _loopback(self._master):
            # host 0 reached us on loopback: it is this machine, and every agent reaches this
            # machine at the address it connected to (host 0's own 127.0.0.1 included)
            cfg["master_is_controller"] = True
        elif self._master:
            cfg["env"] = {**cfg.get("env", {}), "MASTER_ADDR": self._master}
        reply = self._signer.pack({"op": "config"}, [json.dumps(cfg).encode()])
        with self._lock:
            self._answered[who] = reply
        return reply


def _loopback(addr: str) -> bool:
    import ipaddress

    try:
        ip = ipaddress.ip_address(addr.strip("[]").split("%")[0])
    except ValueError:
        return addr == "localhost"
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool(ip.is_loopback or (mapped is not None and mapped.is_loopback))


# --- the agent's side ------------------------------------------------------------------------

_ANY = ("0.0.0.0", "*", "[::]", "::")


def reach_controller(cfg: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """A controller listening on every interface (``--listen 0.0.0.0``) is reached at the
    address this host's launcher came from: ssh's client ($SSH_CONNECTION), srun's host
    ($SLURM_SRUN_COMM_HOST)."""
    out = dict(cfg)
    for k in ("controller_in", "controller_out"):
        scheme, _, rest = cfg[k].partition("://")
        host, _, port = rest.rpartition(":")
        if scheme != "tcp" or host not in _ANY:
            continue
        ssh_client = env.get("SSH_CONNECTION", "").split()[:1]
        origin = ssh_client[0] if ssh_client else env.get("SLURM_SRUN_COMM_HOST")
        if not origin:
            sys.exit(f"viceroy agent (host {cfg.get('host')}): the controller listens on {host}, every "
                     "interface, and this agent cannot tell which address reaches it; give the controller "
                     "an address these hosts can reach (--listen ADDR / interface=ADDR)")
        out[k] = f"tcp://{origin}:{port}"
    return out



def request_config(addr: str, key: bytes, want: int | None = None, wait: float = 60.0) -> dict[str, Any]:
    """Ask the controller at `addr` for this agent's configuration, retrying until it answers or
    `wait` seconds pass (the controller may start after the agent)."""
    host, port = split_address(addr)
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise ValueError(f"cannot look up the controller's host {host!r} ({e.strerror}); give its address "
                         f"instead, e.g. --connect 10.0.0.1:{port}") from None
    signer = Signer(key)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IMMEDIATE, 1)  # no requests queued up while connecting: one per try
    sock.connect(f"tcp://{host}:{port}")
    deadline = time.monotonic() + wait
    said = ""
    nonce = secrets.token_hex(16)  # this request's, kept across its retries
    try:
        while True:
            req = {"op": "attach", "hostname": socket.gethostname(), "pid": os.getpid(), "want": want, "nonce": nonce}
            try:
                sock.send_multipart(signer.pack(req), flags=zmq.NOBLOCK)
                patience = 1000
            except zmq.Again:
                patience = 50  # not connected yet: try again soon
            if sock.poll(patience):
                header, signed, _ = signer.unpack(sock.recv_multipart())
                if header.get("op") == "refused":
                    raise RuntimeError(f"the controller at {host}:{port} refused this agent: {header['why']}")
                if header.get("op") == "wait":
                    why = str(header.get("why", "it asked this agent to wait"))
                    if time.monotonic() >= deadline:
                        raise TimeoutError(f"the controller at {host}:{port} still had no host for this agent "
                                           f"after {wait:.0f} s: {why}; --wait SECONDS waits longer")
                    if why != said:  # say once what it waits for
                        print(f"viceroy agent: waiting: {why}", file=sys.stderr, flush=True)
                        said = why
                    time.sleep(0.2)
                    continue
                cfg: dict[str, Any] = json.loads(bytes(signed[0]))
                break
            if time.monotonic() > deadline and said:  # it answered, then went quiet
                raise TimeoutError(
                    f"the controller at {host}:{port} stopped answering while this agent waited ({said}): its "
                    "mesh shut down or its process died; start the agent again once a mesh waits there"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"no answer from a controller at {host}:{port} within {wait:.0f} s: is a mesh "
                    "waiting there (Mesh.attach / %mesh up --launcher attach), and is this the mesh's key? "
                    "(messages signed with another key are dropped unread)"
                )
    finally:
        sock.close()
        ctx.term()
    # The mesh's sockets, on the address this agent reached the controller by.
    for k in ("controller_in", "controller_out"):
        cfg[k] = f"tcp://{host}:{cfg[k].rsplit(':', 1)[1]}"
    if cfg.pop("master_is_controller", False):  # host 0 is the controller's machine
        cfg["env"] = {**cfg.get("env", {}), "MASTER_ADDR": host}
    cfg["key"] = key.hex()
    cfg["stdin_lifeline"] = False
    return cfg
