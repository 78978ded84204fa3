"""Which network interface a rank's gloo connections use, on meshes that span hosts.

gloo (torch.distributed's CPU backend, ours and the user's own ``init_process_group("gloo")``)
binds to the address this machine's hostname resolves to, or to loopback when that fails. Many
machines resolve their own name to a loopback address (Debian's ``127.0.1.1`` line in
/etc/hosts, containers, namespaces): gloo then tells its peers on other hosts to connect to
127.x, and every cross-host collective fails with "Connection refused". torchrun leaves users
to set ``GLOO_SOCKET_IFNAME``. Ranks here get it, unless the user set it, naming the interface that
routes to rank 0's host (``MASTER_ADDR``), the one the mesh's traffic already takes: the agent
works it out once for its host and puts it in its ranks' environment.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import socket
import struct
import sys
from collections.abc import Mapping

_SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address


def source_address(host: str) -> str | None:
    """The local IPv4 address this machine sends from to reach `host` (a name or an address);
    None if `host` does not resolve or there is no route. Sends nothing (a UDP socket's connect
    only picks the route)."""
    try:
        infos = socket.getaddrinfo(host, 9, socket.AF_INET, socket.SOCK_DGRAM)
    except (OSError, UnicodeError):
        return None
    for *_, addr in infos:
        with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(addr)
            return str(s.getsockname()[0])
    return None


def interface_of(address: str) -> str | None:
    """The name of the interface holding IPv4 `address`, or None (not Linux, not found)."""
    if not sys.platform.startswith("linux"):
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
            except OSError:  # no IPv4 address on it
                continue
            if socket.inet_ntoa(raw[20:24]) == address:
                return name
    return None


def gloo_env(env: Mapping[str, str]) -> dict[str, str]:
    """``{"GLOO_SOCKET_IFNAME": name}`` for ranks whose environment is `env`: the interface this
    machine reaches ``MASTER_ADDR`` from. Empty where `env` sets it already, or that is loopback
    (a mesh on one host, where loopback is right), or it cannot be told. Only an interface's
    primary IPv4 address is matched: from an alias, or over IPv6, gloo keeps its own choice."""
    master = env.get("MASTER_ADDR")
    if not master or env.get("GLOO_SOCKET_IFNAME"):
        return {}
    source = source_address(master)
    if source is None or ipaddress.ip_address(source).is_loopback:
        return {}
    name = interface_of(source)
    return {} if name is None else {"GLOO_SOCKET_IFNAME": name}
