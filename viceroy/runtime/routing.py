"""Where the controller's messages go: work and control for some ranks (straight to them when
the controller talks to each rank, else one copy per host to its agent, which fans out), and
lifecycle messages to agents. A mixin of `Controller`, first among its bases (the others only
declare these methods), which owns the state declared here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from viceroy.runtime.launcher import AgentProcess
from viceroy.runtime.shape import rank_runs
from viceroy.runtime.transport import ControllerSockets
from viceroy.runtime.wire import Signer


class Routing:
    signer: Signer
    _sockets: ControllerSockets
    _direct: bool
    _agents: dict[int, AgentProcess]
    _host_of: dict[int, int]
    _hosts_of_ranks: dict[tuple[int, ...], list[int]]
    # Declared, not defined: this class comes first among Controller's bases, and a stub here
    # would shadow HostLifecycle's method.
    _agent_ident: Callable[[int], bytes]

    def _broadcast(self, header: dict[str, Any], hosts: set[int] | None = None) -> None:
        """To agents (lifecycle: restart, shutdown, their own stats)."""
        header["ranks"] = rank_runs(header.get("ranks", ()))
        frames = self.signer.pack(header)
        self._send([self._agent_ident(h) for h in sorted(set(self._agents) if hosts is None else hosts)], frames)

    def _to_ranks(self, ranks: Sequence[int], frames: list[Any], control: bool = False) -> None:
        """Work (or control) for some ranks: straight to them in direct mode, else one copy per
        host to its agent, which fans out."""
        if self._direct and control:
            self._send([f"c{r}".encode() for r in ranks], frames)
        elif self._direct:  # work: on the ranks' local links, read by their main threads
            self._sockets.send_links(ranks, frames)
        else:
            self._send([self._agent_ident(h) for h in self._hosts_of(ranks)], frames)

    def _hosts_of(self, ranks: Sequence[int]) -> list[int]:
        """The hosts of `ranks`, sorted; cached, since the same meshes are called again and again."""
        key = tuple(ranks)
        hosts = self._hosts_of_ranks.get(key)
        if hosts is None:
            if len(self._hosts_of_ranks) >= 256:
                self._hosts_of_ranks.clear()
            hosts = self._hosts_of_ranks[key] = sorted({self._host_of[r] for r in ranks})
        return hosts

    def _send(self, idents: list[bytes], frames: list[Any]) -> None:
        self._sockets.send(idents, frames)
