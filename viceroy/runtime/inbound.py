"""The controller's IO thread, and what each message from ranks and agents does: answers go to
the calls in flight, output and publications become events, query replies wake their askers,
hellos and exits change rank states. Tasks other threads hand it (`call_soon`) run between
rounds.

A mixin of `Controller`, which owns the state declared here; it comes before the bases that
only declare these methods, so its own are the ones that run.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from viceroy.runtime import serialize
from viceroy.runtime.calls import Query
from viceroy.runtime.launcher import AgentProcess
from viceroy.runtime.links import Link
from viceroy.runtime.logs import RankLogs
from viceroy.runtime.outcomes import Event
from viceroy.runtime.transport import ControllerSockets
from viceroy.runtime.wire import BadMessage, Signer


class Inbound:
    signer: Signer
    logs: RankLogs
    agent_info: dict[int, dict[str, Any]]
    preload_failures: dict[str, str]
    _agents_ready: set[int]
    _agents: dict[int, AgentProcess]
    _sockets: ControllerSockets
    _closed: bool
    _tasks: deque[Callable[[], None]]
    _listeners: list[Callable[[Event], None]]
    _lock: threading.RLock
    _changed: threading.Condition
    _queries: dict[int, Query]
    _gen: dict[int, int]
    _host_of: dict[int, int]
    _lost: dict[int, str]
    _last_seen: dict[int, float]
    _startup_error: str | None
    # Declared, not defined: the bases after this one define them, and a stub here would
    # shadow theirs.
    _next_deadline: Callable[[], float | None]
    _check_deadlines: Callable[[], None]
    _on_results: Callable[[dict[str, Any], list[Any], list[Any]], None]
    _on_rank_ready: Callable[[int, int], None]
    _on_rank_exit: Callable[..., None]

    def _wake(self) -> None:
        self._sockets.wake()

    def call_soon(self, task: Callable[[], None]) -> None:
        """Run `task` on the IO thread, soon. Takes no lock, so it is safe from any thread and
        from anywhere, even from a weak reference's callback in the middle of this class's own
        code (which may hold its locks)."""
        self._tasks.append(task)
        self._wake()

    def _io_loop(self) -> None:
        errors = 0
        while not self._closed:
            try:
                self._io_round()
            except Exception:  # a bug of ours: say so (a few times), but never stop answering calls
                errors += 1
                if errors <= 3:
                    sys.stderr.write("viceroy: the controller's IO thread hit an error and goes on:\n")
                    traceback.print_exc()

    def _io_round(self) -> None:
        if self._sockets.wait(self._next_deadline()):
            while self._tasks:
                self._tasks.popleft()()
        self._handle_received()
        self._check_deadlines()

    def _handle_received(self) -> None:
        """Handle every message already there, without waiting for more."""
        self._handle_all(self._sockets.received())

    def _handle_all(self, received: Iterable[tuple[list[Any], Link | None]]) -> None:
        for frames, link in received:
            try:
                self._handle(frames, link)
            except BadMessage:
                pass  # dropped unread; the signer counted it

    def _handle(self, frames: list[Any], link: Link | None = None) -> None:
        header, signed, data = self.signer.unpack(frames)
        op = header.get("op")
        if "gen" in header and header["gen"] != self._gen.get(header.get("host", -1)):
            return  # from an agent given up for lost (its ranks were reported dead): ignore it
        if "gen" in header:
            self._last_seen[header["host"]] = time.monotonic()
        if op == "heartbeat":
            return
        if op == "results":
            self._on_results(header, signed, data)
        elif op == "out":
            text = self.logs.feed(header["r"], header["s"], bytes(signed[0]))
            self._emit({"type": "output", "rank": header["r"], "stream": "stderr" if header["s"] == "stderr" else "stdout",
                        "text": text, "call": header.get("id")})
        elif op == "pub":
            self._emit({"type": "publish", "rank": header["r"], "call": header.get("id"), "kind": header["kind"],
                        "data": serialize.loads(signed[0], data)})
        elif op in ("stacks", "stats"):
            with self._lock:
                q = self._queries.get(header["id"])
                key = ("agent", header["agent"]) if "agent" in header else header.get("r")
                if q is not None and key in q.expected:
                    q.replies[key] = bytes(signed[0]).decode() if op == "stacks" else header
                    if set(q.replies) >= q.expected:
                        q.done.set()
        elif op in ("rank_ready", "hello"):  # from the agent, or from the rank in direct mode
            if self._host_of.get(header["r"]) in self._lost:
                return  # a direct-mode rank of a lost launch (no generation on links): dying with it
            if link is not None and self._sockets.links is not None:  # its work goes there now
                self._sockets.links.bind(header["r"], link)
            self._on_rank_ready(header["r"], header["pid"])
        elif op == "rank_exit":
            # Reported by the agent, on ZeroMQ: what a rank sent on its link before it died (its
            # last words, which may say why) is there now, and goes first.
            self._handle_all(self._sockets.read_links())
            self._on_rank_exit(header["r"], header["reason"], header.get("respawning", False), header.get("pid"))
        elif op == "agent_hello":
            self.agent_info[header["host"]] = header
            if (agent := self._agents.get(header["host"])) is not None:
                agent.said_hello()
        elif op == "agent_ready":
            with self._changed:  # `start` waits for it: the failures below are known when it returns
                for name, why in header.get("failed", {}).items():  # the ranks import it themselves
                    self.preload_failures.setdefault(name, why)
                self._agents_ready.add(header["host"])
                self._changed.notify_all()
        elif op == "agent_error":
            with self._changed:
                self._startup_error = header["error"]
                self._changed.notify_all()

    def _emit(self, event: Event) -> None:
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception as exc:  # a broken listener must not break the mesh
                print(f"viceroy: event listener {listener!r} raised {exc!r}", file=sys.__stderr__)
