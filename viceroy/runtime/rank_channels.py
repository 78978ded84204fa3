"""How a rank is connected: where its work and control come from, and where what it sends goes.

- Control (cancel, stacks, actors): a ZeroMQ DEALER, read by the rank's IO thread, so a busy
  rank still answers.
- Everything the rank sends (answers, output, displays, replies): its local link
  (`viceroy.runtime.links`), to the controller itself when the mesh is on the controller's host
  alone (direct mode), else to its agent, which aggregates per host.
- Work (run, push), read by the main thread: on that link too in direct mode, else a ZeroMQ
  DEALER to the agent. The thread waits for it and for signals at once
  (`viceroy.runtime.signal_wakeup`), so that a signal's handler runs between calls.

When the other end is gone (end of file, a broken pipe) nobody is left to answer: the rank exits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import zmq

from viceroy.runtime.links import RankLink
from viceroy.runtime.procs import die_now
from viceroy.runtime.signal_wakeup import SignalWakeup
from viceroy.runtime.wire import BadMessage, Signer


class RankChannels:
    def __init__(self, cfg: dict[str, Any], signer: Signer) -> None:
        rank = cfg["rank"]
        self.signer = signer
        self.ctx = zmq.Context()
        self.link = RankLink(cfg["links"])
        self.control = self._dealer(f"c{rank}", cfg["inbox"])
        self.work = None if cfg.get("direct") else self._dealer(f"w{rank}", cfg["inbox"])
        self.wakeup = SignalWakeup()  # made here, on the main thread

    def _dealer(self, identity: str, addr: str) -> zmq.Socket[Any]:
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, identity.encode())
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(addr)
        return sock

    def hello(self, rank: int, pid: int) -> None:
        """Say this rank is up: on the link to the controller, or to the agent on both
        ZeroMQ sockets (it learns their identities from them)."""
        hello = self.signer.pack({"op": "hello", "r": rank, "pid": pid})
        if self.work is None:
            self.deliver(hello)
        else:
            self.control.send_multipart(hello)
            self.work.send_multipart(hello)

    def deliver(self, frames: list[Any]) -> None:
        """Send one packed message (callers hold the rank's send lock)."""
        try:
            self.link.send(frames)
        except OSError:  # the controller (or agent) is gone
            die_now(0)

    def receive_work(self) -> tuple[dict[str, Any], list[Any], list[Any]]:
        """The next call (on the main thread only)."""
        return self._receive(self.work, self.wakeup.until_ready)

    def receive_control(self) -> tuple[dict[str, Any], list[Any], list[Any]]:
        return self._receive(self.control, None)

    def _receive(self, sock: zmq.Socket[Any] | None,
                 until_ready: Callable[[Any], None] | None) -> tuple[dict[str, Any], list[Any], list[Any]]:
        while True:
            if sock is None:
                frames = self._receive_on_link(until_ready)
            else:
                if until_ready is not None:
                    until_ready(sock)
                frames = sock.recv_multipart(copy=False)
            try:
                return self.signer.unpack(frames)
            except BadMessage:
                continue  # dropped before anything was parsed; counted by the signer

    def _receive_on_link(self, until_ready: Callable[[Any], None] | None) -> list[Any]:
        frames = self.link.recv(until_ready)
        if frames is None:  # the controller is gone
            die_now(0)
        return frames  # type: ignore[return-value]
