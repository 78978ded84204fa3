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

The agent's half is `attach_agent.py`; the key, `mesh_key.py`.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq

from viceroy.runtime.arguments import split_address
from viceroy.runtime.launcher import (
    AgentProcess,
    HostPlan,
    Launcher,
    plan_by_hosts,
    users_master_addr,
)
from viceroy.runtime.mesh_key import KEY_ENV, key_for_controller
from viceroy.runtime.wire import BadMessage, Signer

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
