"""The hosts of the ssh launcher: named in a list or a hostfile, each checked before anything
starts (ssh reads a word starting with '-' as one of its options)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SshHost:
    address: str  # what ssh connects to: "node1", "user@10.0.0.2"
    python: str | None = None  # this host's Python (default: the launcher's)


def host_list(hosts: Any) -> list[SshHost]:
    """`hosts` (names or SshHosts, in order: the order numbers them) as checked SshHosts."""
    if isinstance(hosts, str | bytes) or not isinstance(hosts, Sequence):  # a set: which is host 0?
        raise TypeError(f"hosts={hosts!r}: give a list of host names, e.g. ['node1', 'node2'] (or a hostfile); "
                        "their order numbers the hosts")
    checked = [h if isinstance(h, SshHost) else SshHost(h) for h in hosts]
    if not checked:
        raise ValueError("the ssh launcher needs at least one host")
    for h, host in enumerate(checked):
        why = address_problem(host.address)
        if why:
            raise ValueError(f"host {h} ({host.address!r}): {why}")
        if host.python is not None and (not isinstance(host.python, str) or not host.python.strip()):
            raise ValueError(f"host {h} ({host.address}): python={host.python!r}: give the path of its Python")
    return checked


def address_problem(address: object) -> str | None:
    """Why `address` cannot name a host for ssh (None when it can): ssh reads a word starting
    with '-' as one of its options, and a space or a control character in a host name as
    another word, or as nothing."""
    if not isinstance(address, str):
        return f"a host is named by a string, e.g. 'node1' or 'user@10.0.0.2', not by {type(address).__name__}"
    if not address:
        return "a host name cannot be empty"
    if address.startswith("-"):
        return "a host name cannot start with '-' (ssh would read it as an option: put ssh's options in ssh_options)"
    if any(c.isspace() or not c.isprintable() for c in address):
        return "a host name holds no spaces nor control characters"
    return None


def read_hostfile(path: str) -> list[SshHost]:
    """One host per line, optionally ``python=PATH``; blank lines and ``#`` comments skipped."""
    hosts = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            opts = dict(w.split("=", 1) for w in words[1:] if "=" in w)
            bad = [w for w in words[1:] if "=" not in w or not w.startswith("python=")]
            if bad:
                raise ValueError(f"{path}:{n}: unknown host option {bad[0]!r} (only python=PATH)")
            why = address_problem(words[0])
            if why:
                raise ValueError(f"{path}:{n}: {words[0]!r}: {why}")
            if "python" in opts and not opts["python"]:
                raise ValueError(f"{path}:{n}: python= names no Python: give its path, python=PATH")
            hosts.append(SshHost(words[0], opts.get("python")))
    if not hosts:
        raise ValueError(f"{path} lists no hosts")
    return hosts
