"""Several "hosts" on this machine: network namespaces joined to the root namespace by veth
pairs, so traffic between the controller and an agent really crosses interfaces, and taking a
veth down cuts a host off.

    root namespace: the controller's address 10.213.0.1 on loopback (reachable over any link)
    host i (1..n):  namespace vr<tag>h<i>, address 10.213.<i>.2, default route through the
                    root end of its veth (10.213.<i>.1)

10.213.0.0/16 is used by nothing else here; a file lock keeps two test runs from using it at
once. Everything is removed in `close`, also when a test fails.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass, field

CONTROLLER_ADDR = "10.213.0.1"
_LOCK = "/tmp/viceroy-netns-10.213.lock"
_FORWARD = "/proc/sys/net/ipv4/ip_forward"


def skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2 is not installed (apt-get install iproute2; make test does, as root)"
    return None


def ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")


@dataclass
class Hosts:
    n: int
    tag: str = field(default_factory=lambda: secrets.token_hex(2))
    _lock_fd: int = -1
    _made: list[tuple[str, str]] = field(default_factory=list)  # ("netns"|"link"|"addr"|"route", name)

    def ns(self, i: int) -> str:
        return f"vr{self.tag}h{i}"

    def root_end(self, i: int) -> str:
        return f"vr{self.tag}r{i}"

    def interface(self, i: int) -> str:
        """Host i's end of its veth, inside its namespace."""
        return f"vr{self.tag}n{i}"

    def address(self, i: int) -> str:
        return f"10.213.{i}.2"

    def open(self) -> Hosts:
        self._lock_fd = os.open(_LOCK, os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            ip("addr", "add", f"{CONTROLLER_ADDR}/32", "dev", "lo")  # up whichever link is cut
            self._made.append(("addr", CONTROLLER_ADDR))
            # While a host's link is down, its address must not fall through to the default
            # route (out of this machine): it is unreachable, at once.
            ip("route", "add", "unreachable", "10.213.0.0/16")
            self._made.append(("route", "10.213.0.0/16"))
            # Hosts reach each other through the root namespace, as through a switch (rank 0's
            # rendezvous); the previous setting comes back in `close`.
            with open(_FORWARD) as f:
                self._made.append(("forward", f.read().strip()))
            with open(_FORWARD, "w") as f:
                f.write("1")
            for i in range(1, self.n + 1):
                ns, root, inner = self.ns(i), self.root_end(i), self.interface(i)
                ip("netns", "add", ns)
                self._made.append(("netns", ns))
                ip("link", "add", root, "type", "veth", "peer", "name", inner)
                self._made.append(("link", root))
                ip("link", "set", inner, "netns", ns)
                ip("addr", "add", f"10.213.{i}.1/24", "dev", root)
                ip("link", "set", root, "up")
                ip("-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", inner)
                ip("-n", ns, "link", "set", inner, "up")
                ip("-n", ns, "link", "set", "lo", "up")
                ip("-n", ns, "route", "add", "default", "via", f"10.213.{i}.1")
        except BaseException:
            self.close()
            raise
        return self

    def cut(self, i: int) -> None:
        ip("link", "set", self.root_end(i), "down")

    def mend(self, i: int) -> None:
        ip("link", "set", self.root_end(i), "up")

    def bytes_through(self, i: int) -> int:
        """Bytes received plus sent on host i's root-side veth."""
        base = f"/sys/class/net/{self.root_end(i)}/statistics"
        return sum(int(open(f"{base}/{d}_bytes").read()) for d in ("rx", "tx"))

    def exec_argv(self, i: int) -> list[str]:
        return ["ip", "netns", "exec", self.ns(i)]

    def close(self) -> None:
        for kind, name in reversed(self._made):
            if kind == "netns":
                subprocess.run(["ip", "netns", "delete", name], capture_output=True)
            elif kind == "forward":
                with open(_FORWARD, "w") as f:
                    f.write(name)
            elif kind == "route":
                subprocess.run(["ip", "route", "del", "unreachable", name], capture_output=True)
            elif kind == "addr":
                subprocess.run(["ip", "addr", "del", f"{name}/32", "dev", "lo"], capture_output=True)
            else:
                subprocess.run(["ip", "link", "delete", name], capture_output=True)
        self._made.clear()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1
