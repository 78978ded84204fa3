"""The agent's side of reaching a controller: asking an attach mesh's controller for this host's
configuration (`viceroy agent --connect ADDR`), and finding the address of a controller that
listens on every interface. The controller's side is `attach.py`."""

from __future__ import annotations

import json
import os
import secrets
import socket
import sys
import time
from typing import Any

import zmq

from viceroy.runtime.arguments import split_address
from viceroy.runtime.wire import Signer

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
